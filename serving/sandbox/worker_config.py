"""The SIMULATED SGLang worker's knobs (:class:`WorkerConfig`), the command line derived from them, and the local
"model" directory it reports: a tiny tokenizer, so the router never reaches for a model hub. The worker itself, its
routes and its process: :mod:`serving.sandbox.worker` (``python -m serving.sandbox.worker``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, models, pre_tokenizers

from serving.sglang_health import HEALTH_POLL_S

LOOPBACK = "127.0.0.1"
# SGLang's own e2e latency buckets start at 0.1 s; simulated latencies are milliseconds, so finer
# buckets come first to keep quantiles meaningful. The default of ``--bucket-e2e-request-latency`` (SGLang's
# flag, which the sandbox passes with the fleet's rendered buckets as the real server gets them).
SGLANG_E2E_BUCKETS_S = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0)
E2E_BUCKETS_S = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, *SGLANG_E2E_BUCKETS_S)
_UNKNOWN = "[UNK]"
# the tiny tokenizer's vocabulary; a generation's text repeats it
SIMULATED_CONTEXT_LENGTH = 4096  # the simulated model's context: /v1/models max_model_len, the tokenizer's limit
VOCAB_WORDS = ("simulated", "output", "from", "worker", "version", "the", "a", "token", "hello", "world")
MAX_TOTAL_TOKENS = 65536  # the default simulated KV pool (--kv-pool-tokens)
# SGLang 0.5.23's /health (http_server.py health_generate): a one-token generation through the scheduler, then a check
# of the scheduler's last output after every `await asyncio.sleep(1)`, 503 once SGLANG_HEALTH_CHECK_TIMEOUT (default 20,
# http_server.py:218) passed without one. tests/test_sandbox_worker_fidelity.py reads these from the pinned source.
HEALTH_CHECK_TIMEOUT_S = 20.0
HEALTH_MAX_NEW_TOKENS = 1
DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's SamplingParams default; a one-token step is this share of a generation


@dataclass(frozen=True)
class WorkerConfig:
    """Every knob of one simulated worker; the command line is derived from these fields."""

    port: int
    version: str = "v1"
    host: str = LOOPBACK
    latency_ms: float = 20.0
    jitter_ms: float = 5.0
    error_rate: float = 0.0
    bad_request_rate: float = 0.0
    stream_break_rate: float = 0.0
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
        for name in ("error_rate", "bad_request_rate", "stream_break_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                problems.append(f"{name}={getattr(self, name)}: must be a share in [0, 1], e.g. 0.05 for 5 %")
        if self.error_rate + self.bad_request_rate > 1.0:
            problems.append(
                f"error_rate={self.error_rate} + bad_request_rate={self.bad_request_rate}: the two shares of one "
                "request's outcome must add up to 1 at most"
            )
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
    "bad_request_rate": "share answered as SGLang refuses a request it cannot serve: HTTP 400 (a streamed /generate: "
    "200 and an error chunk)",
    "stream_break_rate": "share of streamed generations whose connection drops after the first chunk",
    "seed": "seed of the error, refusal, stream-break and jitter draws",
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
    vocab = {_UNKNOWN: 0} | {word: i + 1 for i, word in enumerate(VOCAB_WORDS)}
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
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "unk_token": _UNKNOWN,
                "model_max_length": SIMULATED_CONTEXT_LENGTH,
            }
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


def health_answer_bound_s(config: WorkerConfig) -> float:
    """How long a caller gives a healthy ``/health`` of this worker: its answer comes after one poll period (and the
    one-token step before it), so a second period is the room a loaded machine gets: 2 × ``health_poll_s`` (2 s
    against SGLang's 1 s poll), never under 1 s."""
    return max(1.0, 2 * config.health_poll_s)
