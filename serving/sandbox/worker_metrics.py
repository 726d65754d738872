"""The SIMULATED SGLang worker's Prometheus series (:mod:`serving.sandbox.worker`): SGLang 0.5.23's names and label
sets, its start-up constants, the simulation's own two series, and the ``/metrics`` exposition.
tests/test_sandbox_worker_fidelity.py holds the names and label sets against the pinned source."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest

from serving.sandbox.worker_config import WorkerConfig
from serving.sglang_metrics import INTER_TOKEN_LATENCY, ITL_BUCKETS_S

# The label sets of SGLang 0.5.23's metrics (observability/metrics_collector.py): the scheduler's collector labels its
# series model_name, engine_type, tp_rank, pp_rank, moe_ep_rank (+ priority "" and dp_rank when those are on), the
# tokenizer's model_name, engine_type (+ priority); counters and histograms of requests add is_streaming.
ENGINE_TYPE = "unified"  # DisaggregationMode.to_engine_type of a server without PD disaggregation
MAX_EXPOSITIONS = 8  # /metrics renderings kept between counter updates (one per state of the scheduler's gauges)


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


class WorkerMetrics:
    """One simulated worker's registry: the scheduler's and the tokenizer's series, and the ``/metrics`` expositions
    rendered since the last counter or histogram update."""

    def __init__(self, config: WorkerConfig) -> None:
        self.priority_scheduling = config.priority_scheduling
        # The /metrics expositions rendered since the last counter or histogram update, by the gauges they showed:
        # rendering costs 2.3 ms of CPU (8 times a /health), and node agents read every worker's each heartbeat
        # while their own generating health check runs, so that the gauges alternate between two states (one
        # running request and none) with nothing else changed: one cached exposition was rendered again each time
        # (at 2,048 workers on two cores, a quarter of the worker processes' CPU). The key is the gauges' whole state,
        # the load's zero entries included (they are never dropped: a priority seen once keeps its 0 series, so the
        # same key is the same label sets). SGLang itself renders on every scrape (prometheus_client's multiprocess
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
        self._tpot = Histogram(
            "sglang:request_time_per_output_token_seconds",
            "Per-request TPOT in seconds: (finished_time - first_token_time) / (completion_tokens - 1).",
            per_request,
            buckets=ITL_BUCKETS_S,
            registry=self.registry,
        )
        self._itl = Histogram(
            INTER_TOKEN_LATENCY,
            "Histogram of inter-token latency in seconds.",
            list(self.tokenizer_labels),
            buckets=ITL_BUCKETS_S,
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
        # SGLang's HTTP middleware (observability/http_request_metrics.py, on with --enable-metrics): every request by
        # route and method, every response by route, status and method, the status at the response's head (a stream's
        # 200 before its first chunk, whatever follows in it)
        self._http_requests = Counter(
            "sglang:http_requests",
            "Total number of HTTP requests by endpoint and method",
            ["endpoint", "method"],
            registry=self.registry,
        )
        self._http_responses = Counter(
            "sglang:http_responses",
            "Total number of HTTP responses by endpoint and status code",
            ["endpoint", "status_code", "method"],
            registry=self.registry,
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

    def request_labels(self, priority: str, *, streaming: bool = False) -> dict[str, str]:
        """A finished request's tokenizer labels: its priority (with priority scheduling) and is_streaming."""
        labels = dict(self.tokenizer_labels)
        if self.priority_scheduling:
            labels["priority"] = priority
        return labels | {"is_streaming": "true" if streaming else "false"}

    def record_http(self, endpoint: str, method: str, status: int) -> None:
        """A request answered: ``sglang:http_requests_total`` and ``sglang:http_responses_total``."""
        self._http_requests.labels(endpoint=endpoint, method=method).inc()
        self._http_responses.labels(endpoint=endpoint, status_code=str(status), method=method).inc()
        self._changes += 1

    def record_request(
        self, labels: dict[str, str], latency_s: float, prompt_tokens: int, generated: int, generating_s: float
    ) -> None:
        """A generation served: its latency, its tokens and, over more than one token, its time per output token (the
        ``generating_s`` from its admission to its finish over its tokens but the first, as SGLang's
        ``get_time_per_output_token``: decode time ÷ (completion tokens − 1)), under ``labels``
        (:meth:`request_labels`)."""
        self._e2e.labels(**labels).observe(latency_s)
        if generated > 1:
            self._tpot.labels(**labels).observe(generating_s / (generated - 1))
        self._requests.labels(**labels).inc()
        self._prompt_tokens.labels(**labels).inc(prompt_tokens)
        self._generation_tokens.labels(**labels).inc(generated)
        self._changes += 1

    def record_output(self, priority: str, interval_s: float, tokens: int) -> None:
        """A request's output after its first, ``tokens`` new tokens ``interval_s`` after its last output: SGLang's
        ``observe_inter_token_latency`` (the interval over the tokens, observed once per token; the sum gets the
        interval) under the tokenizer's labels and the request's priority (with priority scheduling)."""
        if tokens <= 0:
            return
        labels = dict(self.tokenizer_labels)
        if self.priority_scheduling:
            labels["priority"] = priority
        histogram = self._itl.labels(**labels)
        for _ in range(tokens):
            histogram.observe(interval_s / tokens)
        self._changes += 1

    def record_injected_error(self) -> None:
        """A request failed on purpose (``sim_worker_injected_errors``)."""
        self._injected_errors.inc()
        self._changes += 1

    def exposition(self, load: Mapping[tuple[int, str, str], int], usage: float) -> bytes:
        """The ``/metrics`` body with the scheduler's gauges at ``load`` (requests by DP rank, priority and state) and
        KV usage ``usage``: rendered once per state of the gauges between counter updates (see ``__init__``)."""
        gauges = (tuple(sorted(load.items())), usage)
        if self._expositions_at != self._changes or len(self._expositions) >= MAX_EXPOSITIONS:
            self._expositions, self._expositions_at = {}, self._changes
        body = self._expositions.get(gauges)
        if body is None:
            for rank, labels in enumerate(self.scheduler_labels):
                self.export_rank(rank, labels, load, usage)
            body = self._expositions[gauges] = generate_latest(self.registry)
        return body

    def export_rank(
        self, rank: int, labels: dict[str, str], load: Mapping[tuple[int, str, str], int], usage: float
    ) -> None:
        """One DP rank's scheduler gauges as ``_log_gauge_queue_count`` sets them: the total under the rank's labels
        (``priority=""`` when priority scheduling is on) and, with priority scheduling, each priority seen so far
        under ``priority="<n>"`` (0 once it has none)."""
        for gauge, state in ((self._running_gauge, "running"), (self._queue_gauge, "waiting")):
            by_priority = {p: n for (r, p, k), n in load.items() if r == rank and k == state}
            gauge.labels(**labels).set(sum(by_priority.values()))
            if self.priority_scheduling:
                for priority, n in by_priority.items():
                    gauge.labels(**(labels | {"priority": priority})).set(n)
        self._token_usage.labels(**labels).set(usage)
