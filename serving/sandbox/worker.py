"""SIMULATED SGLang worker for the sandbox. This is NOT SGLang and runs no model.

It exists so the rolling updater and the *real* gateway (``smg`` 1.13, the SGLang router) can be exercised on a
machine without GPUs: it speaks the HTTP surface the router and an updater call on an SGLang server,
with the same paths, JSON shapes and Prometheus metric names, and it answers generation requests after a
configurable simulated latency, failing a seeded share of them with HTTP 500.

Start-up follows the real server (``sglang/srt/entrypoints/http_server.py``, ``launch_server``): the
engine loads the model *before* uvicorn binds the port, so during ``--startup-delay-s`` the port refuses
connections; once it listens, ``/health`` and ``/health_generate`` answer 503 while the server status
is still ``Starting`` (SGLang's warmup request) for ``--warmup-s``, and 200 afterwards.
``--never-ready`` keeps answering 503 for ever (a warmup that never finishes). On SIGTERM the health
endpoints answer 503 (SGLang's ``gracefully_exit``), the port closes and in-flight requests get up to
``--shutdown-timeout-s`` to finish.

Fault drills (``exaserve drill`` on the sandbox) change a running worker through ``PUT /sim/fault`` (SIMULATION
ONLY, no such route on a real server): added delay with jitter on every answer, health checks included (what
``tc netem`` or an in-path proxy does to a real server's traffic; this kernel has no netem), HTTP 500 on every
answer, or memory pressure (``sglang:token_usage`` reported high and generation slowed). ``DELETE /sim/fault``
clears it; a restarted worker starts without one, as a restart clears a real replica's wedged state.

Like SGLang's ``emit_constants``, it exports its KV pool once: ``sglang:max_total_num_tokens`` (``--kv-pool-tokens``)
and, when given, ``sglang:weight_memory_usage_gb`` and ``sglang:kv_cache_memory_usage_gb``; the sandbox gives each
release the plan's figures, the pool off by the release's ``kv_skew`` (:func:`serving.sandbox.backend.worker_config`),
for the rollout's check of the plan (:mod:`serving.rollout.kvpool`).

``/health`` is SGLang 0.5.23's ``health_generate``: a one-token generation through the (simulated) scheduler, then a
check of the scheduler's output after every ``--health-poll-s`` (SGLang sleeps 1 s), so a healthy answer takes at
least one period and a router health-check timeout of 1 s fails against it; 200 or 503 only, 503 after
``--health-timeout-s`` (``SGLANG_HEALTH_CHECK_TIMEOUT``) without output. A wedged scheduler (fault ``wedged``) keeps
HTTP, ``/metrics`` and ``/model_info`` answering while generations and ``/health`` never complete; its ``/v1/loads``
and scheduler gauges are what the scheduler last published (:class:`~serving.sandbox.worker_scheduler.LoadSnapshot`),
frozen while it is wedged or stalled, as SGLang's. Generations stream as SGLang's when asked
(:mod:`serving.sandbox.worker_stream`), a chunk per scheduler output. Metrics carry
SGLang's labels (``engine_type``, ``tp_rank``, ``pp_rank``, ``moe_ep_rank``; ``priority`` and ``dp_rank`` with
``--priority-scheduling`` and ``--dp-size``). tests/test_sandbox_worker_fidelity.py holds all this against the
pinned source.

The router fetches the tokenizer of the ``model_path`` a worker reports; the worker reports a local
directory holding a tiny ``tokenizer.json`` built with the ``tokenizers`` library, so the router never
reaches for a model hub.

Its parts: :mod:`serving.sandbox.worker_config` (the knobs, the command line and the model directory),
:mod:`serving.sandbox.worker_scheduler` (the simulated scheduler and the faults a drill puts on it),
:mod:`serving.sandbox.worker_metrics` (SGLang's series and the ``/metrics`` exposition); this module holds the HTTP
routes and the process.

Run: ``python -m serving.sandbox.worker --port 31000 --version v1``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import signal
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from serving.router import INFERENCE_PATHS
from serving.sandbox.worker_config import (
    DEFAULT_MAX_NEW_TOKENS,
    HEALTH_MAX_NEW_TOKENS,
    SIMULATED_CONTEXT_LENGTH,
    VOCAB_WORDS,
    WorkerConfig,
    ensure_model_dir,
    parse_config,
)
from serving.sandbox.worker_metrics import WorkerMetrics
from serving.sandbox.worker_scheduler import NO_FAULT, InjectedFault, SimulatedScheduler
from serving.sandbox.worker_stream import CONTENT_TYPE as STREAM_CONTENT_TYPE
from serving.sandbox.worker_stream import DONE as STREAM_DONE
from serving.sandbox.worker_stream import Endpoint, StreamChunks
from serving.sandbox.worker_stream import event as stream_event
from serving.sglang_metrics import FORCE_STREAM_INTERVAL

SIMULATOR = "serving.sandbox.worker (SIMULATED SGLang worker, no model, no GPU)"
SIMULATED_SGLANG_VERSION = "0.0.0+simulated"
# The sections /v1/loads?include= takes (SGLang's LoadSnapshot.VALID_SECTIONS).
LOADS_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})
FAULT_PATH = "/sim/fault"
HEALTH_PATHS = ("/health", "/health_generate")  # one handler in SGLang (health_generate)
REQUEST_PRIORITY = "0"  # a request without one, as --default-priority-value 0 gives it


class SimulatedWorker:
    """HTTP handlers of one simulated SGLang worker, over its scheduler (:class:`SimulatedScheduler`) and its metrics
    (:class:`WorkerMetrics`)."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self._rng = random.Random(config.seed)
        self._ready_at = float("inf") if config.never_ready else time.monotonic() + config.warmup_s
        self._shutting_down = False
        self.scheduler = SimulatedScheduler(config)
        self.metrics = WorkerMetrics(config)
        self._flap_checks = 0  # generating health checks since the fault was put (``InjectedFault.flap_stall_s``)

    # ----- routes -------------------------------------------------------------------------------
    def build_app(self) -> web.Application:
        app = web.Application(middlewares=[self._faulted, self._http_metrics])
        app.router.add_get(FAULT_PATH, self.get_fault)
        app.router.add_put(FAULT_PATH, self.put_fault)
        app.router.add_delete(FAULT_PATH, self.delete_fault)
        for path in HEALTH_PATHS:
            app.router.add_get(path, self.health)
        app.router.add_get("/server_info", self.server_info)
        app.router.add_get("/get_server_info", self.server_info)
        app.router.add_get("/model_info", self.model_info)
        app.router.add_get("/get_model_info", self.model_info)
        app.router.add_get("/v1/loads", self.loads)
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_get("/metrics", self.get_metrics)
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        return app

    @web.middleware
    async def _http_metrics(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """SGLang's HTTP metrics middleware: each answer counted by its route, status and method, at its head (inside
        the fault, which stands for what is in front of the server). The generation routes only: SGLang counts every
        route, but a probe or a scrape counted would change every ``/metrics`` answer (each rendered afresh, 512
        workers a second in the scale sandbox) and no figure read from these counts one."""
        response: web.StreamResponse = await handler(request)
        if request.path in INFERENCE_PATHS:
            self.metrics.record_http(request.path, request.method, response.status)
        return response

    @web.middleware
    async def _faulted(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """The injected fault, on every route but the fault's own."""
        fault = self.scheduler.fault
        if request.path == FAULT_PATH or fault == NO_FAULT:
            response: web.StreamResponse = await handler(request)
            return response
        delay_ms = fault.delay_ms + self._rng.uniform(-1, 1) * fault.jitter_ms
        if delay_ms > 0:
            await asyncio.sleep(delay_ms / 1000)
        if fault.errors:
            if request.path in HEALTH_PATHS:
                return web.Response(status=503)  # SGLang's /health answers 200 or 503, nothing else
            self.metrics.record_injected_error()
            return _error(500, "simulated fault: every request fails (exaserve drill error-burst)")
        response = await handler(request)
        return response

    async def get_fault(self, _request: web.Request) -> web.Response:
        return web.json_response(self.scheduler.fault.to_json())

    async def put_fault(self, request: web.Request) -> web.Response:
        try:
            fault = InjectedFault.from_json(await request.json())
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
            return _error(400, str(exc))
        self._flap_checks = 0
        await self.scheduler.set_fault(fault)
        return web.json_response(self.scheduler.fault.to_json())

    async def delete_fault(self, _request: web.Request) -> web.Response:
        self._flap_checks = 0
        await self.scheduler.set_fault(NO_FAULT)
        return web.json_response(self.scheduler.fault.to_json())

    def begin_shutdown(self) -> None:
        self._shutting_down = True

    @property
    def ready(self) -> bool:
        return not self._shutting_down and time.monotonic() >= self._ready_at

    async def health(self, request: web.Request) -> web.Response:
        """SGLang 0.5.23's ``health_generate``: 503 while starting or shutting down; ``/health`` with
        ``health_generation`` off (``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false``, which the rendered servers set)
        200 at once; else a one-token generation through the scheduler, and after every ``health_poll_s`` a look at
        whether the scheduler produced any output since the check began (any request's, this one's included): 200 once
        it did, 503 after ``health_timeout_s``. A generating answer therefore takes at least one poll period (1 s on
        SGLang)."""
        if not self.ready:
            return web.Response(status=503)
        c = self.config
        if request.path == HEALTH_PATHS[0] and not c.health_generation:
            return web.Response(status=200)
        if self.scheduler.fault.flap_stall_s > 0:
            self._flap_checks += 1
            if self._flap_checks % 2 == 1:
                await self.scheduler.stall(self.scheduler.fault.flap_stall_s)
        tic = time.monotonic()
        step_s = c.latency_ms * self.scheduler.fault.slowdown / 1000 / DEFAULT_MAX_NEW_TOKENS
        generation = asyncio.create_task(self.scheduler.schedule(1 + HEALTH_MAX_NEW_TOKENS, step_s, REQUEST_PRIORITY))
        try:
            while time.monotonic() < tic + c.health_timeout_s:
                await asyncio.sleep(c.health_poll_s)
                if self.scheduler.last_output > tic:
                    return web.Response(status=200)
            return web.Response(status=503)
        finally:
            generation.cancel()

    def _server_info(self) -> dict[str, Any]:
        c = self.config
        return {
            "simulated": True,
            "simulator": SIMULATOR,
            "version": SIMULATED_SGLANG_VERSION,
            "weight_version": c.version,
            "model_path": c.model_path,
            "tokenizer_path": c.model_path,
            "served_model_name": c.served_model_name,
            "host": c.host,
            "port": c.port,
            "tp_size": c.dp_size,
            "dp_size": c.dp_size,
            "max_running_requests": c.max_running_requests,
            "max_total_tokens": c.kv_pool_tokens,
            "status": "Up" if self.ready else "Starting",
            "internal_states": [
                {
                    "dp_rank": rank,
                    "num_running_reqs": sum(
                        n for (r, _p, k), n in self.scheduler.load.items() if (r, k) == (rank, "running")
                    ),
                }
                for rank in range(c.dp_size)
            ],
        }

    async def server_info(self, _request: web.Request) -> web.Response:
        return web.json_response(self._server_info())

    async def model_info(self, _request: web.Request) -> web.Response:
        c = self.config
        return web.json_response(
            {
                "model_path": c.model_path,
                "tokenizer_path": c.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": c.version,
                "model_type": "llama",
                "architectures": ["LlamaForCausalLM"],
            }
        )

    async def loads(self, request: web.Request) -> web.Response:
        """``GET /v1/loads`` in SGLang 0.5.23's shape (``sglang/srt/entrypoints/v1_loads.py``, one
        ``LoadSnapshot.to_dict`` per DP rank, ``sglang/srt/managers/load_snapshot.py``): the core figures always, the
        ``memory``, ``disaggregation`` and ``queues`` sections unless ``include`` leaves them out (``speculative`` and
        ``lora`` are absent, as on a server without them); an unknown section is a 400 as there. What smg polls:
        ``/v1/loads?include=core,disagg,queues,memory``. Figures SGLang has and this worker does not simulate
        (throughput, cache hits, prefill counters) are 0."""
        include = {part.strip() for part in request.query.get("include", "").split(",") if part.strip()} or None
        if include is not None and not include <= LOADS_SECTIONS:
            unknown = sorted(include - LOADS_SECTIONS)
            message = f"Invalid include sections: {unknown}. Valid options: {sorted(LOADS_SECTIONS)}"
            # SGLang raises HTTPException(400) here; its handler answers ErrorResponse with the status as the type
            return web.json_response({"object": "error", "message": message, "type": "400", "code": 400}, status=400)
        rank = request.query.get("dp_rank")
        if rank is not None and rank != "0":
            return web.json_response(_loads_body([]))
        c = self.config
        published = self.scheduler.published()  # frozen while the scheduler is wedged or stalled
        load: dict[str, Any] = {
            "timestamp": published.timestamp,
            "dp_rank": 0,
            "num_running_reqs": published.running,
            "num_waiting_reqs": published.waiting,
            "num_waiting_uncached_tokens": 0,
            "num_used_tokens": published.tokens_in_flight,
            "num_total_tokens": published.tokens_in_flight,
            "num_active_tokens": published.tokens_in_flight,
            "num_prealloc_ready_tokens": 0,
            "max_total_num_tokens": c.kv_pool_tokens,
            "max_running_requests": c.max_running_requests,
            "token_usage": round(published.kv_usage, 4),
            "gen_throughput": 0.0,
            "cache_hit_rate": 0.0,
            "utilization": round(published.running / c.max_running_requests, 4),
            "total_prefill_uncached_tokens": 0,
            "total_prefill_busy_us": 0,
            "decode_moments": None,
        }
        every = include is None or "all" in include
        sections: dict[str, tuple[str, dict[str, Any]]] = {
            "memory": (
                "memory",
                {"weight_gb": 0.0, "kv_cache_gb": 0.0, "graph_gb": 0.0, "token_capacity": c.kv_pool_tokens},
            ),
            "disaggregation": (
                "disagg",
                {
                    "mode": "null",
                    "prefill_bootstrap_queue_reqs": 0,
                    "prefill_inflight_queue_reqs": 0,
                    "decode_prealloc_queue_reqs": 0,
                    "decode_transfer_queue_reqs": 0,
                    "decode_retracted_queue_reqs": 0,
                    "kv_transfer_speed_gb_s": 0.0,
                    "kv_transfer_latency_ms": 0.0,
                },
            ),
            "queues": (
                "queues",
                {"waiting": published.waiting, "grammar": 0, "paused": 0, "retracted": 0, "prealloc_ready": 0},
            ),
        }
        for name, (section, figures) in sections.items():
            if every or (include is not None and section in include):
                load[name] = figures
        return web.json_response(_loads_body([load]))

    async def list_models(self, _request: web.Request) -> web.Response:
        c = self.config
        card = {
            "id": c.served_model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "sglang",
            "root": c.model_path,
            "max_model_len": SIMULATED_CONTEXT_LENGTH,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def get_metrics(self, _request: web.Request) -> web.Response:
        published = self.scheduler.published()  # the scheduler's gauges: its published figures, frozen when it stops
        body = self.metrics.exposition(published.load, published.kv_usage)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def generate(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "generate")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "completions")

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "chat")

    # ----- generation -----------------------------------------------------------------------------
    async def _serve(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, 'request body is not JSON; send a JSON object such as {"text": "hello"}')
        if not isinstance(body, dict):
            return _error(400, f"request body is {type(body).__name__}; send a JSON object")
        if self._shutting_down:
            return _error(503, "the simulated worker is shutting down; retry on another worker")
        priority = str(body.get("priority", REQUEST_PRIORITY)) if self.config.priority_scheduling else REQUEST_PRIORITY
        per_request = self.metrics.request_labels(priority)
        c = self.config
        draw = 1.0 if self.scheduler.fault.generation_errors else self._rng.random()  # one draw: the request's outcome
        if self.scheduler.fault.generation_errors or draw < c.error_rate:
            why = (
                "every generation fails (fault)"
                if self.scheduler.fault.generation_errors
                else f"error_rate={self.config.error_rate}"
            )
            self.metrics.record_injected_error()
            if body.get("stream"):  # SGLang has sent its 200 head already: the failure comes in the stream
                return await _failed_stream(request, endpoint, f"simulated engine failure: {why}")
            return _error(500, f"simulated engine failure: {why}")
        max_tokens = _max_new_tokens(body, endpoint)
        prompt_tokens = _prompt_token_count(body, endpoint)
        if draw < c.error_rate + c.bad_request_rate:
            return await _refused(request, endpoint, bool(body.get("stream")), prompt_tokens, max_tokens)
        latency_ms = self.config.latency_ms + self._rng.uniform(-1, 1) * self.config.jitter_ms
        duration_s = max(0.0, latency_ms) * self.scheduler.fault.slowdown / 1000
        words = [VOCAB_WORDS[i % len(VOCAB_WORDS)] for i in range(max_tokens)]
        model = str(body.get("model") or "default")  # SGLang echoes the request's model (protocol.py: "default")
        started = time.monotonic()
        if body.get("stream"):
            return await self._stream(request, endpoint, body, words, prompt_tokens, model, duration_s, priority)
        # SGLang hands a non-streamed request's output to the tokenizer every FORCE_STREAM_INTERVAL tokens and at its end
        outputs = max(1, -(-max_tokens // FORCE_STREAM_INTERVAL))
        gap = self._gaps(priority, lambda k: min(max_tokens, k * FORCE_STREAM_INTERVAL))

        async def output(produced: int) -> None:
            gap(produced)

        generating_s = await self.scheduler.schedule(
            prompt_tokens + max_tokens, duration_s, priority, outputs=outputs, emit=output
        )
        latency_s = time.monotonic() - started
        self.metrics.record_request(per_request, latency_s, prompt_tokens, max_tokens, generating_s)
        return web.json_response(self._payload(endpoint, " ".join(words), prompt_tokens, max_tokens, latency_s, model))

    async def _stream(
        self,
        request: web.Request,
        endpoint: Endpoint,
        body: dict[str, Any],
        words: list[str],
        prompt_tokens: int,
        model: str,
        duration_s: float,
        priority: str,
    ) -> web.StreamResponse:
        """SGLang's SSE stream (:mod:`serving.sandbox.worker_stream`): a chunk per output as the scheduler produces
        it, so a stall or a wedge holds the stream mid-body, then ``[DONE]``. The 200 head goes out at once on
        ``/generate`` (its StreamingResponse is returned before generating: http_server.py), at the first output on
        the OpenAI routes (they await it first: serving_chat.py, serving_completions.py), so a wedged worker holds
        their head and smg's request timeout ends such a request before any byte. A client that goes away aborts
        the request."""
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        chunks = StreamChunks(endpoint, uuid.uuid4().hex, model, self.config.version, prompt_tokens, len(words),
                              include_usage)  # fmt: skip
        response = web.StreamResponse(headers={"Content-Type": STREAM_CONTENT_TYPE})
        if endpoint == "generate":
            await response.prepare(request)
        breaks = self.config.stream_break_rate > 0 and self._rng.random() < self.config.stream_break_rate

        gap = self._gaps(priority, lambda k: k)

        async def emit(produced: int) -> None:
            gap(produced)
            if not response.prepared:
                await response.prepare(request)
            await response.write(chunks.output(words[:produced]))
            if breaks:  # the connection drops mid-body (a crashed process, a reset): no [DONE], no clean end
                assert request.transport is not None
                request.transport.abort()
                raise ConnectionResetError(f"stream_break_rate={self.config.stream_break_rate}: dropped mid-stream")

        started = time.monotonic()
        try:
            generating_s = await self.scheduler.schedule(
                prompt_tokens + len(words), duration_s, priority, outputs=len(words), emit=emit
            )
        except ConnectionResetError:  # the client went, or the break above: the request is aborted
            return response
        await response.write(chunks.end())
        self.metrics.record_request(
            self.metrics.request_labels(priority, streaming=True),
            time.monotonic() - started,
            prompt_tokens,
            len(words),
            generating_s,
        )
        await response.write_eof()
        return response

    def _gaps(self, priority: str, tokens_at: Callable[[int], int]) -> Callable[[int], None]:
        """What the tokenizer observes of one request's outputs (:meth:`WorkerMetrics.record_output`): called with the
        count of outputs so far at each, ``tokens_at`` of which gives the tokens they hold; the first is its time to
        first token, each later one an interval since the last over the tokens it brought."""
        at, before = 0.0, 0

        def output(produced: int) -> None:
            nonlocal at, before
            now, tokens = time.monotonic(), tokens_at(produced)
            if produced > 1:
                self.metrics.record_output(priority, now - at, tokens - before)
            at, before = now, tokens

        return output

    def _payload(
        self, endpoint: Endpoint, text: str, prompt: int, completion: int, latency_s: float, model: str
    ) -> Any:
        c = self.config
        rid = uuid.uuid4().hex
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        if endpoint == "generate":
            return {
                "text": text,
                "meta_info": {
                    "id": rid,
                    "finish_reason": {"type": "length", "length": completion},
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "cached_tokens": 0,
                    "e2e_latency": latency_s,
                    "weight_version": c.version,
                },
            }
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": "length"}
        if endpoint == "chat":
            choice["message"] = {"role": "assistant", "content": text}
            kind = "chat.completion"
        else:
            choice["text"] = text
            kind = "text_completion"
        return {
            "id": rid,
            "object": kind,
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
            "usage": usage,
        }


def _loads_body(loads: list[dict[str, Any]]) -> dict[str, Any]:
    """The envelope of SGLang's ``/v1/loads`` answer around the per-rank loads."""
    return {
        "timestamp": datetime.now(UTC).isoformat(),
        "version": SIMULATED_SGLANG_VERSION,
        "accelerator": None,  # SGLang's get_device_name() on a machine without an accelerator
        "num_accelerators": 1,
        "loads": loads,
    }


async def _failed_stream(request: web.Request, endpoint: Endpoint, message: str) -> web.StreamResponse:
    """A streamed generation the engine failed after SGLang sent its 200 head: on ``/generate`` the scheduler's abort
    as an ordinary last chunk (``finish_reason {"type": "abort", "status_code": 500}``, tokenizer_manager.py), on the
    OpenAI routes an error chunk (serving_base.py ``create_streaming_error_response``), then ``[DONE]``. smg sees a
    200 and counts the worker's success: only the client's read shows it."""
    response = web.StreamResponse(headers={"Content-Type": STREAM_CONTENT_TYPE})
    await response.prepare(request)
    if endpoint == "generate":
        reason = {"type": "abort", "message": message, "status_code": 500, "err_type": "InternalServerError"}
        chunk: dict[str, Any] = {"text": "", "output_ids": [], "meta_info": {"finish_reason": reason}}
    else:
        chunk = {"error": {"object": "error", "message": message, "type": "InternalServerError", "param": None,
                           "code": 500}}  # fmt: skip
    await response.write(stream_event(chunk) + STREAM_DONE)
    await response.write_eof()
    return response


async def _refused(
    request: web.Request, endpoint: Endpoint, stream: bool, prompt_tokens: int, max_tokens: int
) -> web.StreamResponse:
    """A request SGLang refuses, as it refuses one over the context length (tokenizer_manager.py
    ``_validate_one_request``'s ValueError): 400 ``BadRequestError`` on the OpenAI routes (streamed too: they check
    before the first chunk), 400 ``{"error": {"message"}}`` on ``/generate``, and on a streamed ``/generate`` 200 with
    one error chunk then ``[DONE]`` (http_server.py ``stream_results``)."""
    message = (
        f"Requested token count exceeds the model's maximum context length of {SIMULATED_CONTEXT_LENGTH} tokens. You "
        f"requested a total of {prompt_tokens + max_tokens} tokens: {prompt_tokens} tokens from the input messages and "
        f"{max_tokens} tokens for the completion (simulated: bad_request_rate)."
    )
    if endpoint != "generate":
        body = {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}
        return web.json_response(body, status=400)
    if not stream:
        return web.json_response({"error": {"message": message}}, status=400)
    response = web.StreamResponse(headers={"Content-Type": STREAM_CONTENT_TYPE})
    await response.prepare(request)
    chunk = {"error": {"message": message, "type": "invalid_request_error", "code": 400, "retryable": False}}
    await response.write(stream_event(chunk) + STREAM_DONE)
    await response.write_eof()
    return response


def _error(status: int, message: str) -> web.Response:
    """SGLang's error body (``ErrorResponse``): object, message, type, code."""
    kind = {400: "BadRequest", 500: "InternalServerError", 503: "ServiceUnavailable"}[status]
    return web.json_response({"object": "error", "message": message, "type": kind, "code": status}, status=status)


def _max_new_tokens(body: dict[str, Any], endpoint: Endpoint) -> int:
    """Requested output length; defaults as SGLang's: 128 (``SamplingParams``), 16 for ``/v1/completions``."""
    default = 16 if endpoint == "completions" else 128
    if endpoint == "generate":
        params = body.get("sampling_params") or {}
        value = params.get("max_new_tokens", default) if isinstance(params, dict) else default
    else:
        value = body.get("max_completion_tokens") or body.get("max_tokens") or default
    return max(1, min(int(value), SIMULATED_CONTEXT_LENGTH)) if isinstance(value, int | float) else default


def _prompt_token_count(body: dict[str, Any], endpoint: Endpoint) -> int:
    if endpoint == "chat":
        messages = body.get("messages") or []
        text = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
    else:
        prompt = body.get("text" if endpoint == "generate" else "prompt", "")
        text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
    return max(1, len(text.split()))


class _DropGrpcProbes(logging.Filter):
    """Drop aiohttp's traceback for the router's gRPC probe.

    Before it settles on HTTP the router opens an HTTP/2 (gRPC) connection to every new worker; aiohttp,
    like uvicorn in front of a real SGLang server, answers that preface with a 400 and logs a traceback.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], BadHttpMessage))


async def serve(config: WorkerConfig) -> None:
    """Load (sleep), listen, then serve until SIGTERM or SIGINT; drain in-flight requests on exit."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # "Model loading": the real server binds its port only after the engine is up.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=config.startup_delay_s)
    if stop.is_set():
        return
    ensure_model_dir(Path(config.model_path))
    worker = SimulatedWorker(config)
    runner = web.AppRunner(worker.build_app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, shutdown_timeout=config.shutdown_timeout_s)
    await site.start()
    print(f"simulated SGLang worker {config.version} listening on {config.url}", file=sys.stderr, flush=True)
    await stop.wait()
    worker.begin_shutdown()
    await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = parse_config(sys.argv[1:] if argv is None else argv)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiohttp.server").addFilter(_DropGrpcProbes())
    try:
        asyncio.run(serve(config))
    except OSError as exc:
        print(f"error: cannot listen on {config.url}: {exc.strerror}; choose a free --port", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
