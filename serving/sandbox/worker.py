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
HTTP, ``/metrics`` and ``/model_info`` answering while generations and ``/health`` never complete. Metrics carry
SGLang's labels (``engine_type``, ``tp_rank``, ``pp_rank``, ``moe_ep_rank``; ``priority`` and ``dp_rank`` with
``--priority-scheduling`` and ``--dp-size``). tests/test_sandbox_worker_fidelity.py holds all this against the
pinned source.

The router fetches the tokenizer of the ``model_path`` a worker reports; the worker reports a local
directory holding a tiny ``tokenizer.json`` built with the ``tokenizers`` library, so the router never
reaches for a model hub.

Run: ``python -m serving.sandbox.worker --port 31000 --version v1``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import logging
import os
import random
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from tokenizers import Tokenizer, models, pre_tokenizers

from serving.sglang_health import HEALTH_POLL_S

LOOPBACK = "127.0.0.1"
SIMULATOR = "serving.sandbox.worker (SIMULATED SGLang worker, no model, no GPU)"
SIMULATED_SGLANG_VERSION = "0.0.0+simulated"
# SGLang's own e2e latency buckets start at 0.1 s; simulated latencies are milliseconds, so finer
# buckets come first to keep quantiles meaningful. The default of ``--bucket-e2e-request-latency`` (SGLang's
# flag, which the sandbox passes with the fleet's rendered buckets as the real server gets them).
SGLANG_E2E_BUCKETS_S = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0)
E2E_BUCKETS_S = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, *SGLANG_E2E_BUCKETS_S)
_UNKNOWN = "[UNK]"
_VOCAB_WORDS = ("simulated", "output", "from", "worker", "version", "the", "a", "token", "hello", "world")
Endpoint = Literal["generate", "completions", "chat"]
MAX_TOTAL_TOKENS = 65536  # the default simulated KV pool (--kv-pool-tokens)
MAX_EXPOSITIONS = 8  # /metrics renderings kept between counter updates (one per state of the scheduler's gauges)
# The sections /v1/loads?include= takes (SGLang's LoadSnapshot.VALID_SECTIONS).
# SGLang 0.5.23's /health (http_server.py health_generate): a one-token generation through the scheduler, then a check
# of the scheduler's last output after every `await asyncio.sleep(1)`, 503 once SGLANG_HEALTH_CHECK_TIMEOUT (default 20,
# http_server.py:218) passed without one. tests/test_sandbox_worker_fidelity.py reads these from the pinned source.
HEALTH_CHECK_TIMEOUT_S = 20.0
HEALTH_MAX_NEW_TOKENS = 1
DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's SamplingParams default; a one-token step is this share of a generation
# The label sets of SGLang 0.5.23's metrics (observability/metrics_collector.py): the scheduler's collector labels its
# series model_name, engine_type, tp_rank, pp_rank, moe_ep_rank (+ priority "" and dp_rank when those are on), the
# tokenizer's model_name, engine_type (+ priority); counters and histograms of requests add is_streaming.
ENGINE_TYPE = "unified"  # DisaggregationMode.to_engine_type of a server without PD disaggregation
LOADS_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})


@dataclass(frozen=True)
class WorkerConfig:
    """Every knob of one simulated worker; the command line is derived from these fields."""

    port: int
    version: str = "v1"
    host: str = LOOPBACK
    latency_ms: float = 20.0
    jitter_ms: float = 5.0
    error_rate: float = 0.0
    seed: int = 0
    startup_delay_s: float = 0.0
    warmup_s: float = 0.0
    never_ready: bool = False
    model_path: str = str(Path(tempfile.gettempdir()) / "exaserve-sim-model")
    served_model_name: str = "exaserve-sim"
    max_running_requests: int = 256
    shutdown_timeout_s: float = 30.0
    health_poll_s: float = HEALTH_POLL_S
    health_timeout_s: float = HEALTH_CHECK_TIMEOUT_S
    health_generation: bool = True
    priority_scheduling: bool = False
    dp_size: int = 1
    bucket_e2e_request_latency: tuple[float, ...] = E2E_BUCKETS_S
    kv_pool_tokens: int = MAX_TOTAL_TOKENS
    weight_memory_gb: float = 0.0
    kv_cache_memory_gb: float = 0.0

    def __post_init__(self) -> None:
        problems = []
        if not 0 < self.port < 65536:
            problems.append(f"port={self.port}: must be in 1..65535")
        if not 0.0 <= self.error_rate <= 1.0:
            problems.append(f"error_rate={self.error_rate}: must be a share in [0, 1], e.g. 0.05 for 5 %")
        for name in (
            "latency_ms",
            "jitter_ms",
            "startup_delay_s",
            "warmup_s",
            "shutdown_timeout_s",
            "health_poll_s",
            "weight_memory_gb",
            "kv_cache_memory_gb",
        ):
            if getattr(self, name) < 0:
                problems.append(f"{name}={getattr(self, name)}: must be >= 0")
        buckets = self.bucket_e2e_request_latency
        if not buckets or any(b <= 0 for b in buckets) or list(buckets) != sorted(set(buckets)):
            problems.append(
                f"bucket_e2e_request_latency={list(buckets)}: give increasing positive bounds in seconds, e.g. 0.1 0.2 0.4"
            )
        if self.kv_pool_tokens < 1:
            problems.append(f"kv_pool_tokens={self.kv_pool_tokens}: must be >= 1")
        if self.health_timeout_s <= 0 or self.health_poll_s <= 0:
            problems.append(
                f"health_poll_s={self.health_poll_s}, health_timeout_s={self.health_timeout_s}: both must be > 0 "
                f"(SGLang: {HEALTH_POLL_S:g} s and {HEALTH_CHECK_TIMEOUT_S:g} s)"
            )
        if self.dp_size < 1:
            problems.append(f"dp_size={self.dp_size}: must be >= 1 (data-parallel ranks, each with its scheduler)")
        if self.max_running_requests < 1:
            problems.append(f"max_running_requests={self.max_running_requests}: must be >= 1")
        if not self.version:
            problems.append("version='': give the version name this worker reports, e.g. v2")
        if problems:
            raise ValueError("invalid simulated worker config: " + "; ".join(problems))

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def to_argv(self) -> list[str]:
        """Command-line flags that make :func:`parse_config` return this config."""
        argv: list[str] = []
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            flag = "--" + field.name.replace("_", "-")
            if isinstance(value, bool):
                if value:
                    argv.append(flag)
            elif isinstance(value, tuple):
                argv += [flag, *(f"{v:g}" for v in value)]
            else:
                argv += [flag, str(value)]
        return argv


_HELP = {
    "port": "TCP port to listen on",
    "version": "version name this worker reports (server_info weight_version, sim_worker_info)",
    "host": "address to bind; keep it on loopback",
    "latency_ms": "mean simulated latency of one generation request",
    "jitter_ms": "latency varies uniformly by up to this much either way",
    "error_rate": "share of generation requests answered with HTTP 500, e.g. 0.05",
    "seed": "seed of the error and jitter draws",
    "startup_delay_s": "simulated model loading: the port stays closed this long",
    "warmup_s": "after listening, /health answers 503 this long (SGLang's warmup)",
    "never_ready": "/health answers 503 for ever",
    "model_path": "local directory reported as model_path; a tiny tokenizer.json is written there",
    "served_model_name": "model name reported to the router and in responses",
    "max_running_requests": "requests served at once; more wait in the queue (sglang:num_queue_reqs)",
    "shutdown_timeout_s": "on SIGTERM, how long in-flight requests may take to finish",
    "health_poll_s": "a ready /health checks the scheduler's output this often, first after one period (SGLang: 1)",
    "health_timeout_s": "/health answers 503 when the scheduler produced nothing this long (SGLANG_HEALTH_CHECK_TIMEOUT)",
    "health_generation": "/health generates as /health_generate does (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION); when "
    "false, /health answers 200 at once unless starting or shutting down",
    "priority_scheduling": "label scheduler and tokenizer metrics with priority, as --enable-priority-scheduling does",
    "dp_size": "data-parallel attention ranks: each rank's scheduler exports its own series, labelled dp_rank",
    "bucket_e2e_request_latency": "bounds of the sglang:e2e_request_latency_seconds histogram (SGLang's flag)",
    "kv_pool_tokens": "the KV pool in tokens (sglang:max_total_num_tokens, /server_info max_total_tokens)",
    "weight_memory_gb": "GiB the weights took per GPU (sglang:weight_memory_usage_gb; 0: not exported)",
    "kv_cache_memory_gb": "GiB of the KV pool per GPU (sglang:kv_cache_memory_usage_gb; 0: not exported)",
}


def _argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m serving.sandbox.worker",
        description="SIMULATED SGLang worker (no model, no GPU) for the ExaServe sandbox.",
        allow_abbrev=False,
    )
    for field in dataclasses.fields(WorkerConfig):
        flag = "--" + field.name.replace("_", "-")
        default = field.default
        help_text = _HELP[field.name]
        if default is dataclasses.MISSING:
            parser.add_argument(flag, type=int, required=True, help=help_text)
        elif isinstance(default, bool):
            parser.add_argument(flag, action="store_true", help=help_text)
        elif isinstance(default, tuple):
            parser.add_argument(flag, type=float, nargs="+", default=default, help=help_text)
        else:
            parser.add_argument(flag, type=type(default), default=default, help=f"{help_text} (default: {default})")
    return parser


def parse_config(argv: Sequence[str]) -> WorkerConfig:
    """Parse the worker's command line into a validated :class:`WorkerConfig`."""
    args = vars(_argument_parser().parse_args(list(argv)))
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in args.items()}
    return WorkerConfig(**fields)


def tiny_tokenizer_json() -> str:
    """A word-level ``tokenizer.json`` with a ten-word vocabulary, built with the tokenizers library."""
    vocab = {_UNKNOWN: 0} | {word: i + 1 for i, word in enumerate(_VOCAB_WORDS)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=_UNKNOWN))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return tokenizer.to_str()


def ensure_model_dir(path: Path) -> Path:
    """Create the local "model" directory the worker reports: a tiny tokenizer and its config.

    Files are written atomically so that several workers may share one directory.
    """
    path.mkdir(parents=True, exist_ok=True)
    files = {
        "tokenizer.json": tiny_tokenizer_json(),
        "tokenizer_config.json": json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": _UNKNOWN, "model_max_length": 4096}
        ),
    }
    for name, text in files.items():
        target = path / name
        if target.exists() and target.read_text() == text:
            continue
        fd, tmp = tempfile.mkstemp(dir=path, prefix=f".{name}.")
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, target)
    return path


def scheduler_metric_labels(config: WorkerConfig) -> list[dict[str, str]]:
    """The labels of each scheduler's series, one dict per data-parallel rank, as SGLang 0.5.23 builds them
    (``SchedulerMetricsCollector`` context, ``metrics_collector.py:~1382-1392``): data-parallel attention with one
    tensor-parallel rank per DP rank, so every rank is a stats-logging rank (``attn_tp_rank == 0``) and exports."""
    ranks = []
    for rank in range(config.dp_size):
        labels = {
            "model_name": config.served_model_name,
            "engine_type": ENGINE_TYPE,
            "tp_rank": str(rank),
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        if config.priority_scheduling:
            labels["priority"] = ""  # the total; each priority's share is a series of its own
        if config.dp_size > 1:
            labels["dp_rank"] = str(rank)
        ranks.append(labels)
    return ranks


def tokenizer_metric_labels(config: WorkerConfig) -> dict[str, str]:
    """The labels of the tokenizer's series (``tokenizer_metric_labels``, ``metrics_collector.py``); a request fills
    in its priority."""
    labels = {"model_name": config.served_model_name, "engine_type": ENGINE_TYPE}
    if config.priority_scheduling:
        labels["priority"] = ""
    return labels


def health_answer_bound_s(config: WorkerConfig) -> float:
    """How long a caller gives a healthy ``/health`` of this worker: its answer comes after one poll period (and the
    one-token step before it), so a second period is the room a loaded machine gets: 2 × ``health_poll_s`` (2 s
    against SGLang's 1 s poll), never under 1 s."""
    return max(1.0, 2 * config.health_poll_s)


FAULT_PATH = "/sim/fault"
HEALTH_PATHS = ("/health", "/health_generate")  # one handler in SGLang (health_generate)
REQUEST_PRIORITY = "0"  # a request without one, as --default-priority-value 0 gives it


@dataclass(frozen=True)
class InjectedFault:
    """A fault a drill puts on a running simulated worker (``PUT /sim/fault``), SIMULATION ONLY.

    ``delay_ms`` ± ``jitter_ms`` (uniform) delays every answer, health checks and metrics included (an in-path delay);
    ``errors`` fails every answer, as a broken proxy in front of the server would: generations with HTTP 500,
    ``/health`` with 503 (the only failure SGLang's ``/health`` answers); ``generation_errors`` fails generations
    with HTTP 500 while the scheduler still runs, so ``/health`` stays 200 as on a real server whose requests fail
    (SGLang counts no such failure: ``sglang:num_aborted_requests_total`` counts aborts, ``abort_request``; the
    routers' per-worker outcomes and circuit breakers see them); ``wedged`` stops the simulated scheduler
    (a hung forward batch): HTTP, ``/metrics`` and ``/model_info`` answer, generations and ``/health`` never
    complete (``/health`` answers 503 after ``health_timeout_s``); memory pressure: ``token_usage`` is the KV-cache usage reported as
    ``sglang:token_usage``, ``admit`` the requests that still fit the pool (the rest wait in the queue, as SGLang's
    scheduler holds what it cannot admit: ``num_queue_reqs`` and ``/v1/loads`` show them) and ``slowdown``
    multiplies the generation latency; ``flap_stall_s`` (> 0) makes the scheduler flap: the 1st, 3rd, 5th …
    generating health check after the fault (``/health_generate``, the node agents' probe) finds it stalled for that
    long — no request, the check's own one-token generation included, finishes meanwhile, so the check gets no output
    (SGLang's 503 after its timeout, or the caller's timeout first) and every generation in flight waits — and the
    2nd, 4th … find it running: one check in two fails, through the same path as a wedged scheduler's, with the
    clients' requests held up by each stall."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    errors: bool = False
    generation_errors: bool = False
    wedged: bool = False
    token_usage: float | None = None
    admit: int | None = None
    slowdown: float = 1.0
    flap_stall_s: float = 0.0

    def __post_init__(self) -> None:
        problems = [
            f"{n}={getattr(self, n)}: must be >= 0"
            for n in ("delay_ms", "jitter_ms", "flap_stall_s")
            if getattr(self, n) < 0
        ]
        if self.jitter_ms > self.delay_ms:
            problems.append(f"jitter_ms={self.jitter_ms} > delay_ms={self.delay_ms}: a delay cannot go below 0")
        if self.token_usage is not None and not 0.0 <= self.token_usage <= 1.0:
            problems.append(f"token_usage={self.token_usage}: must be a share in [0, 1]")
        if self.admit is not None and self.admit < 1:
            problems.append(f"admit={self.admit}: must be >= 1 (requests running at once under the fault)")
        if self.slowdown < 1.0:
            problems.append(f"slowdown={self.slowdown}: must be >= 1 (a multiplier of the generation latency)")
        if problems:
            raise ValueError("invalid fault: " + "; ".join(problems))

    @classmethod
    def from_json(cls, data: Any) -> InjectedFault:
        if not isinstance(data, dict):
            raise ValueError(f'the fault is {type(data).__name__}; send a JSON object such as {{"errors": true}}')
        known = {f.name for f in dataclasses.fields(cls)}
        if unknown := sorted(set(data) - known):
            raise ValueError(f"unknown fault field(s) {unknown}; use {sorted(known)}")
        try:
            return cls(**data)
        except TypeError as exc:
            raise ValueError(f"invalid fault: {exc}") from exc

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


NO_FAULT = InjectedFault()


class SimulatedWorker:
    """State and HTTP handlers of one simulated SGLang worker."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self._rng = random.Random(config.seed)
        self._slots = asyncio.Semaphore(config.max_running_requests)
        self._ready_at = float("inf") if config.never_ready else time.monotonic() + config.warmup_s
        self._shutting_down = False
        self._running = 0
        self._waiting = 0
        # Requests per (DP rank, priority, "running" | "waiting"): what each rank's scheduler exports.
        self._load: collections.Counter[tuple[int, str, str]] = collections.Counter()
        self._admitted = 0  # requests so far; the n-th goes to DP rank n % dp_size
        self._last_output = float("-inf")  # when the simulated scheduler last finished a request (monotonic)
        self._tokens_in_flight = 0
        self._finished = asyncio.Condition()  # a request ended: one held back by a fault's ``admit`` may start
        self.fault = NO_FAULT
        self._flap_checks = 0  # generating health checks since the fault was put (``InjectedFault.flap_stall_s``)
        self._stalled_until = float("-inf")  # the flapping scheduler's current stall ends then (monotonic)
        self._wakers: set[asyncio.Task[None]] = set()  # the tasks that end the stalls (held: the loop keeps weak refs)
        # The /metrics expositions rendered since the last counter or histogram update, by the gauges they showed:
        # rendering costs 2.3 ms of CPU (8 times a /health), and node agents read every worker's each heartbeat
        # while their own generating health check runs, so that the gauges alternate between two states (one
        # running request and none) with nothing else changed: one cached exposition was rendered again each time
        # (at 2,048 workers on two cores, a quarter of the worker processes' CPU). The key is the gauges' whole state,
        # _load's zero entries included (they are never dropped: a priority seen once keeps its 0 series, so the same
        # key is the same label sets). SGLang itself renders on every scrape (prometheus_client's multiprocess
        # collector): per scrape this stand-in is cheaper than the server, a cost a fleet pays on each replica's own
        # CPU and the sandbox on its shared cores.
        self._changes = 0  # bumped by every counter or histogram update
        self._expositions: dict[tuple[object, ...], bytes] = {}
        self._expositions_at = 0  # the value of _changes they were rendered at
        self.registry = CollectorRegistry(auto_describe=True)
        self.scheduler_labels = scheduler_metric_labels(config)
        self.tokenizer_labels = tokenizer_metric_labels(config)
        scheduler = list(self.scheduler_labels[0])
        per_request = [*self.tokenizer_labels, "is_streaming"]
        self._e2e = Histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            per_request,
            buckets=config.bucket_e2e_request_latency,
            registry=self.registry,
        )
        self._running_gauge = Gauge(
            "sglang:num_running_reqs", "The number of running requests.", scheduler, registry=self.registry
        )
        self._queue_gauge = Gauge(
            "sglang:num_queue_reqs", "The number of requests in the waiting queue.", scheduler, registry=self.registry
        )
        self._token_usage = Gauge(
            "sglang:token_usage",
            "The token usage (share of the KV-cache pool in use).",
            scheduler,
            registry=self.registry,
        )
        self._requests = Counter(
            "sglang:num_requests", "Number of requests processed.", per_request, registry=self.registry
        )
        self._prompt_tokens = Counter(
            "sglang:prompt_tokens", "Number of prefill tokens processed.", per_request, registry=self.registry
        )
        self._generation_tokens = Counter(
            "sglang:generation_tokens", "Number of generation tokens processed.", per_request, registry=self.registry
        )
        self._injected_errors = Counter(
            "sim_worker_injected_errors",
            "SIMULATION ONLY (not an SGLang metric): generation requests failed with HTTP 500 on purpose.",
            ["model_name"],
            registry=self.registry,
        ).labels(model_name=config.served_model_name)
        # SGLang's start-up constants (emit_constants, sglang/srt/observability/metrics_collector.py): set once.
        constants: list[tuple[str, str, float]] = [
            (
                "sglang:max_total_num_tokens",
                "Maximum total number of tokens in the KV cache pool.",
                config.kv_pool_tokens,
            )
        ]
        if config.weight_memory_gb > 0:
            constants.append(
                ("sglang:weight_memory_usage_gb", "Memory used by model weights in GB.", config.weight_memory_gb)
            )
        if config.kv_cache_memory_gb > 0:
            constants.append(
                (
                    "sglang:kv_cache_memory_usage_gb",
                    "Memory used by the KV cache pools in GB.",
                    config.kv_cache_memory_gb,
                )
            )
        for name, text, value in constants:
            gauge = Gauge(name, text, scheduler, registry=self.registry)
            for labels in self.scheduler_labels:
                gauge.labels(**labels).set(value)
        Info(
            "sim_worker",
            "SIMULATION ONLY (not an SGLang metric): identity of this simulated worker.",
            registry=self.registry,
        ).info({"version": config.version, "model_name": config.served_model_name, "simulated": "true"})

    # ----- routes -------------------------------------------------------------------------------
    def build_app(self) -> web.Application:
        app = web.Application(middlewares=[self._faulted])
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
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        return app

    @web.middleware
    async def _faulted(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """The injected fault, on every route but the fault's own."""
        fault = self.fault
        if request.path == FAULT_PATH or fault == NO_FAULT:
            response: web.StreamResponse = await handler(request)
            return response
        delay_ms = fault.delay_ms + self._rng.uniform(-1, 1) * fault.jitter_ms
        if delay_ms > 0:
            await asyncio.sleep(delay_ms / 1000)
        if fault.errors:
            if request.path in HEALTH_PATHS:
                return web.Response(status=503)  # SGLang's /health answers 200 or 503, nothing else
            self._injected_errors.inc()
            self._changes += 1
            return _error(500, "simulated fault: every request fails (exaserve drill error-burst)")
        response = await handler(request)
        return response

    async def get_fault(self, _request: web.Request) -> web.Response:
        return web.json_response(self.fault.to_json())

    async def put_fault(self, request: web.Request) -> web.Response:
        try:
            self.fault = InjectedFault.from_json(await request.json())
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
            return _error(400, str(exc))
        self._flap_checks, self._stalled_until = 0, float("-inf")
        async with self._finished:
            self._finished.notify_all()  # a fault admitting more lets the held-back requests start
        return web.json_response(self.fault.to_json())

    async def delete_fault(self, _request: web.Request) -> web.Response:
        self.fault = NO_FAULT
        self._flap_checks, self._stalled_until = 0, float("-inf")
        async with self._finished:
            self._finished.notify_all()  # what the fault held back may start now
        return web.json_response(self.fault.to_json())

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
        if self.fault.flap_stall_s > 0:
            self._flap_checks += 1
            if self._flap_checks % 2 == 1:
                await self._stall(self.fault.flap_stall_s)
        tic = time.monotonic()
        step_s = c.latency_ms * self.fault.slowdown / 1000 / DEFAULT_MAX_NEW_TOKENS
        generation = asyncio.create_task(self._schedule(1 + HEALTH_MAX_NEW_TOKENS, step_s, REQUEST_PRIORITY))
        try:
            while time.monotonic() < tic + c.health_timeout_s:
                await asyncio.sleep(c.health_poll_s)
                if self._last_output > tic:
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
                    "num_running_reqs": sum(n for (r, _p, k), n in self._load.items() if (r, k) == (rank, "running")),
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

    def _kv_usage(self) -> float:
        """The KV-cache share in use: the fault's figure while memory pressure is injected, else the tokens in flight
        over the simulated pool."""
        usage = self.fault.token_usage
        return usage if usage is not None else min(1.0, self._tokens_in_flight / self.config.kv_pool_tokens)

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
        load: dict[str, Any] = {
            "timestamp": time.time(),
            "dp_rank": 0,
            "num_running_reqs": self._running,
            "num_waiting_reqs": self._waiting,
            "num_waiting_uncached_tokens": 0,
            "num_used_tokens": self._tokens_in_flight,
            "num_total_tokens": self._tokens_in_flight,
            "num_active_tokens": self._tokens_in_flight,
            "num_prealloc_ready_tokens": 0,
            "max_total_num_tokens": c.kv_pool_tokens,
            "max_running_requests": c.max_running_requests,
            "token_usage": round(self._kv_usage(), 4),
            "gen_throughput": 0.0,
            "cache_hit_rate": 0.0,
            "utilization": round(self._running / c.max_running_requests, 4),
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
                {"waiting": self._waiting, "grammar": 0, "paused": 0, "retracted": 0, "prealloc_ready": 0},
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
            "max_model_len": 4096,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def metrics(self, _request: web.Request) -> web.Response:
        usage = self._kv_usage()
        gauges = (tuple(sorted(self._load.items())), usage)
        if self._expositions_at != self._changes or len(self._expositions) >= MAX_EXPOSITIONS:
            self._expositions, self._expositions_at = {}, self._changes
        body = self._expositions.get(gauges)
        if body is None:
            for rank, labels in enumerate(self.scheduler_labels):
                self._export_rank(rank, labels, usage)
            body = self._expositions[gauges] = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    def _export_rank(self, rank: int, labels: dict[str, str], usage: float) -> None:
        """One DP rank's scheduler gauges as ``_log_gauge_queue_count`` sets them: the total under the rank's labels
        (``priority=""`` when priority scheduling is on) and, with priority scheduling, each priority seen so far
        under ``priority="<n>"`` (0 once it has none)."""
        for gauge, state in ((self._running_gauge, "running"), (self._queue_gauge, "waiting")):
            by_priority = {p: n for (r, p, k), n in self._load.items() if r == rank and k == state}
            gauge.labels(**labels).set(sum(by_priority.values()))
            if self.config.priority_scheduling:
                for priority, n in by_priority.items():
                    gauge.labels(**(labels | {"priority": priority})).set(n)
        self._token_usage.labels(**labels).set(usage)

    async def generate(self, request: web.Request) -> web.Response:
        return await self._serve(request, "generate")

    async def completions(self, request: web.Request) -> web.Response:
        return await self._serve(request, "completions")

    async def chat_completions(self, request: web.Request) -> web.Response:
        return await self._serve(request, "chat")

    # ----- generation -----------------------------------------------------------------------------
    async def _serve(self, request: web.Request, endpoint: Endpoint) -> web.Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, 'request body is not JSON; send a JSON object such as {"text": "hello"}')
        if not isinstance(body, dict):
            return _error(400, f"request body is {type(body).__name__}; send a JSON object")
        if body.get("stream"):
            return _error(400, "stream=true: the simulated worker does not stream; send stream=false")
        if self._shutting_down:
            return _error(503, "the simulated worker is shutting down; retry on another worker")
        priority = str(body.get("priority", REQUEST_PRIORITY)) if self.config.priority_scheduling else REQUEST_PRIORITY
        per_request = self._request_labels(priority)
        if self.fault.generation_errors or self._rng.random() < self.config.error_rate:
            why = (
                "every generation fails (fault)"
                if self.fault.generation_errors
                else f"error_rate={self.config.error_rate}"
            )
            self._injected_errors.inc()
            self._changes += 1
            return _error(500, f"simulated engine failure: {why}")
        max_tokens = _max_new_tokens(body, endpoint)
        prompt_tokens = _prompt_token_count(body, endpoint)
        latency_ms = self.config.latency_ms + self._rng.uniform(-1, 1) * self.config.jitter_ms
        started = time.monotonic()
        await self._schedule(prompt_tokens + max_tokens, max(0.0, latency_ms) * self.fault.slowdown / 1000, priority)
        latency_s = time.monotonic() - started
        self._e2e.labels(**per_request).observe(latency_s)
        self._requests.labels(**per_request).inc()
        self._prompt_tokens.labels(**per_request).inc(prompt_tokens)
        self._generation_tokens.labels(**per_request).inc(max_tokens)
        self._changes += 1
        text = " ".join(_VOCAB_WORDS[i % len(_VOCAB_WORDS)] for i in range(max_tokens))
        return web.json_response(self._payload(endpoint, text, prompt_tokens, max_tokens, latency_s))

    def _request_labels(self, priority: str) -> dict[str, str]:
        """A finished request's tokenizer labels: its priority (with priority scheduling) and is_streaming."""
        labels = dict(self.tokenizer_labels)
        if self.config.priority_scheduling:
            labels["priority"] = priority
        return labels | {"is_streaming": "false"}

    def _stopped(self) -> bool:
        """The scheduler makes no progress: wedged, or in a flapping stall."""
        return self.fault.wedged or time.monotonic() < self._stalled_until

    async def _stall(self, seconds: float) -> None:
        """Stall the scheduler for ``seconds`` from now, waking what waits on it when the stall ends."""
        self._stalled_until = time.monotonic() + seconds

        async def wake() -> None:
            await asyncio.sleep(seconds)
            async with self._finished:
                self._finished.notify_all()

        self._wakers.add(task := asyncio.create_task(wake()))
        task.add_done_callback(self._wakers.discard)

    async def _schedule(self, tokens: int, duration_s: float, priority: str) -> None:
        """One request through the simulated scheduler: it waits in its DP rank's queue until a slot (and, under
        memory pressure, the pool) admits it and the scheduler runs, holds ``tokens`` of the KV pool for
        ``duration_s``, and finishes only while the scheduler is not wedged; finishing is the scheduler's output."""
        rank = self._admitted % self.config.dp_size
        self._admitted += 1

        def admissible() -> bool:
            return not self._stopped() and (self.fault.admit is None or self._running < self.fault.admit)

        self._waiting += 1
        self._load[rank, priority, "waiting"] += 1
        try:
            await self._slots.acquire()
            try:
                async with self._finished:
                    await self._finished.wait_for(admissible)
                    self._running += 1
            except BaseException:
                self._slots.release()
                raise
        finally:
            self._waiting -= 1
            self._load[rank, priority, "waiting"] -= 1
        self._load[rank, priority, "running"] += 1
        self._tokens_in_flight += tokens
        try:
            await asyncio.sleep(duration_s)
            async with self._finished:
                await self._finished.wait_for(lambda: not self._stopped())
            self._last_output = time.monotonic()
        finally:
            self._tokens_in_flight -= tokens
            self._load[rank, priority, "running"] -= 1
            self._slots.release()
            async with self._finished:
                self._running -= 1
                self._finished.notify_all()

    def _payload(self, endpoint: Endpoint, text: str, prompt: int, completion: int, latency_s: float) -> Any:
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
            "model": c.served_model_name,
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
    return max(1, min(int(value), 4096)) if isinstance(value, int | float) else default


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
