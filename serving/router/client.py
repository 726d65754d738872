"""Typed client for the gateway's (smg 1.13) runtime worker API and for Prometheus metrics.

Checked against the real ``smg`` 1.13.0 gateway (``python -m smg.launch_router``):

* ``POST /workers {"url": …}`` answers 202 ``{"status": "accepted", "worker_id", "url", "location", "message"}``;
  registration then runs as a background job. ``GET /workers/{id}`` answers the worker at once with ``status:
  pending`` and ``job_status {"job_type": "AddWorker", "status": "processing"}`` while the job asks the worker's
  ``/health`` (every ``--worker-startup-check-interval``, each ask bounded by ``--health-check-timeout-secs``), then
  ``status: ready``, ``is_healthy: true`` and no ``job_status``. A job that gives up (``--worker-startup-timeout-secs``)
  leaves nothing: ``GET /workers/{id}`` answers 404 and only the router's log says why. ``GET /workers`` lists
  pending workers only once they are ready. Adding a URL that is registered answers 409 ``WORKER_ALREADY_EXISTS``.
* ``GET /workers`` answers ``{"workers": [...], "total", "stats"}``; each worker has ``id``, ``url``, ``model_id``,
  ``status``, ``is_healthy``, ``load``, ``worker_type``, ``connection_mode`` (``http``), ``labels`` (what the router
  read from the worker's ``/server_info`` and ``/model_info``) and ``engine_load`` (its ``/v1/loads`` figures).
* ``DELETE /workers/{id}`` answers 202 and DRAINS: the worker is routed to no more at once (``status: draining``,
  ``is_healthy: false``, a ``RemoveWorker`` job ``processing``), requests in flight on it complete, and after
  ``drain_settle_secs`` (5 s; a per-worker setting, not a launcher flag) it leaves the registry: ``GET /workers/{id}``
  then answers 404 and ``smg_worker_health{worker=…}`` is gone (0 while draining).
* Failed upstream attempts (HTTP 5xx, refused or cut connections) are retried on another worker, up to
  5 times by default: clients see no error while ``smg_worker_retries_total`` rises.

Prometheus text (router listener and worker ``/metrics``) is parsed by :mod:`serving.exposition` (``prometheus_client``'s
samples, faster).
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from serving.exposition import samples
from serving.fleet_http import http_client
from serving.sglang_health import SCHEDULER_HEALTH_PATH

# Router (Prometheus listener) metric names.
ROUTER_RESPONSES = "smg_http_responses_total"
ROUTER_REQUESTS = "smg_http_requests_total"
ROUTER_DURATION = "smg_http_request_duration_seconds"
ROUTER_UPSTREAM_RESPONSES = "smg_router_upstream_responses_total"
ROUTER_WORKER_HEALTH = "smg_worker_health"
ROUTER_WORKER_RETRIES = "smg_worker_retries_total"
ROUTER_WORKER_CB_STATE = "smg_worker_cb_state"
CIRCUIT_CLOSED = 0.0  # smg_worker_cb_state: 0 closed, 1 open, 2 half-open
CIRCUIT_OPEN = 1.0
# Worker (SGLang) metric names.
WORKER_RUNNING = "sglang:num_running_reqs"
WORKER_QUEUED = "sglang:num_queue_reqs"
WORKER_REQUESTS_TOTAL = "sglang:num_requests_total"
WORKER_REQUESTS = "sglang:num_requests_total"
WORKER_E2E_LATENCY = "sglang:e2e_request_latency_seconds"


class RouterApiError(RuntimeError):
    """The router answered something other than what its API promises: ``status`` is the answer's HTTP status (None:
    the status was the promised one, the body was not), ``code`` smg's error code when its body carries one
    (``{"error": …, "code": "WORKER_NOT_FOUND"}``, ``WorkerServiceError::error_code`` in smg 1.13.0's
    ``model_gateway/src/worker/service.rs:228-240``)."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code

    @property
    def transient(self) -> bool:
        """The router could not do it now, the request was right: a 5xx (smg answers 500 when its job queue takes no
        job, ``QueueSubmitFailed``/``QueueNotInitialized``, service.rs:250-251; a proxy in front of it 502-504), a 408
        or a 429. Any other 4xx says the request is wrong (smg: 400 ``BAD_REQUEST`` for an id that is no UUID or a URL
        or label it refuses, service.rs:245-249; 401/403 for a missing admin key), which asking again will not fix."""
        return self.status is not None and (self.status >= 500 or self.status in (408, 429))


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class HistogramSnapshot:
    """Cumulative buckets ``(upper bound, count)`` sorted by bound, the last one ``+Inf``."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    sum: float

    def __sub__(self, earlier: HistogramSnapshot) -> HistogramSnapshot:
        """Observations made between ``earlier`` and this snapshot (same bucket layout)."""
        before = dict(earlier.buckets)
        return HistogramSnapshot(
            tuple((le, n - before.get(le, 0.0)) for le, n in self.buckets),
            self.count - earlier.count,
            self.sum - earlier.sum,
        )

    def quantile(self, q: float) -> float:
        """``histogram_quantile`` as Prometheus computes it: linear inside the bucket; NaN if empty."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile q={q}: must be in [0, 1]")
        if not self.buckets or self.buckets[-1][1] <= 0:
            return math.nan
        rank = q * self.buckets[-1][1]
        lower_bound, lower_count = 0.0, 0.0
        for bound, count in self.buckets:
            if count >= rank:
                if math.isinf(bound):
                    return lower_bound
                if count == lower_count:
                    return bound
                return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
            lower_bound, lower_count = bound, count
        return lower_bound


@dataclass(frozen=True)
class MetricsSnapshot:
    """Every sample of one scrape, with label-subset lookups."""

    samples: tuple[Sample, ...]
    scraped_at: float = field(default=0.0, compare=False)

    @classmethod
    def parse(cls, text: str, scraped_at: float = 0.0) -> MetricsSnapshot:
        return cls(tuple(Sample(name, labels, value) for name, labels, value in samples(text)), scraped_at)

    def select(self, name: str, **labels: str) -> list[Sample]:
        return [s for s in self.samples if s.name == name and _matches(s.labels, labels)]

    def value(self, name: str, **labels: str) -> float:
        """Sum of the samples named ``name`` whose labels include ``labels``; 0 when there are none
        (the router creates a series only when it first counts something)."""
        return sum(s.value for s in self.select(name, **labels))

    def per_scheduler(self, name: str) -> dict[str, float]:
        """An SGLang scheduler gauge counted once per data-parallel rank, by ``dp_rank`` ("" without one).

        SGLang 0.5.23 writes one series per exporting scheduler (``metrics_collector.py``, the collector context at
        ~1360-1392 and ``_log_gauge_queue_count``): every pipeline stage exports (``is_stats_logging_rank`` asks only
        for attention-TP rank 0), every TP rank with ``--enable-metrics-for-all-schedulers`` (each the same batch), and
        with priority scheduling the total under ``priority=""`` beside one series per priority. Summing every series
        counts a request once per priority and per stage; this keeps per DP rank the total (``priority`` "" or absent)
        of stage 0 at its lowest TP rank."""
        chosen: dict[str, tuple[int, float]] = {}
        for s in self.select(name):
            if s.labels.get("priority", "") != "" or s.labels.get("pp_rank", "0") != "0":
                continue
            rank, tp = s.labels.get("dp_rank", ""), int(s.labels.get("tp_rank", "0"))
            if rank not in chosen or tp < chosen[rank][0]:
                chosen[rank] = (tp, s.value)
        return {rank: value for rank, (_tp, value) in chosen.items()}

    def by_label(self, name: str, label: str, **labels: str) -> dict[str, float]:
        """Samples of ``name`` summed per value of ``label``."""
        out: dict[str, float] = {}
        for s in self.select(name, **labels):
            key = s.labels.get(label, "")
            out[key] = out.get(key, 0.0) + s.value
        return out

    def grouped(self, name: str, label: str) -> dict[str, list[Sample]]:
        """Samples of ``name`` by the value of ``label`` (in scrape order), in one pass: a router with 2,048 workers
        shows ~6,000 per-worker samples, and a lookup per worker with :meth:`select` took 8 s a read."""
        out: dict[str, list[Sample]] = {}
        for s in self.samples:
            if s.name == name and label in s.labels:
                out.setdefault(s.labels[label], []).append(s)
        return out

    def histogram(self, name: str, **labels: str) -> HistogramSnapshot:
        """The histogram ``name`` (without suffix), buckets summed across other labels."""
        buckets: dict[float, float] = {}
        for s in self.select(f"{name}_bucket", **labels):
            le = float(s.labels["le"])
            buckets[le] = buckets.get(le, 0.0) + s.value
        return HistogramSnapshot(
            tuple(sorted(buckets.items())), self.value(f"{name}_count", **labels), self.value(f"{name}_sum", **labels)
        )

    # ----- router metrics ------------------------------------------------------------------------
    def responses_by_status(self) -> dict[int, float]:
        """Client-facing responses of the router, all paths, per HTTP status (``error_code`` summed)."""
        return {int(code): n for code, n in self.by_label(ROUTER_RESPONSES, "status_code").items()}

    def worker_gauge(self, name: str) -> dict[str, float]:
        """A per-worker router gauge (``smg_worker_health``, ``smg_worker_requests_active``, …) by URL."""
        return self.by_label(name, "worker")

    # ----- worker metrics ------------------------------------------------------------------------
    def info(self, name: str) -> Mapping[str, str] | None:
        """Labels of an ``Info`` metric such as ``sim_worker_info``."""
        found = self.select(name)
        return found[0].labels if found else None


def _matches(labels: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in wanted.items())


@dataclass(frozen=True)
class JobStatus:
    job_type: str
    status: str
    message: str | None


@dataclass(frozen=True)
class WorkerInfo:
    id: str
    url: str
    model_id: str
    status: str  # smg: pending (registering), ready, draining (removed, in-flight requests finishing)
    is_healthy: bool
    load: int
    worker_type: str
    connection_mode: str
    metadata: Mapping[str, str]
    job_status: JobStatus | None


def parse_worker(data: Mapping[str, Any]) -> WorkerInfo:
    """One worker object of ``GET /workers`` or ``GET /workers/{id}``."""
    try:
        job = data.get("job_status")
        return WorkerInfo(
            id=str(data["id"]),
            url=str(data["url"]),
            model_id=str(data.get("model_id", "")),
            status=str(data["status"]),
            is_healthy=bool(data["is_healthy"]),
            load=int(data.get("load", 0)),
            worker_type=str(data.get("worker_type", "")),
            connection_mode=str(data.get("connection_mode", "")),
            metadata={str(k): str(v) for k, v in (data.get("labels") or {}).items()},
            job_status=JobStatus(str(job["job_type"]), str(job["status"]), job.get("message")) if job else None,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise RouterApiError(f"unexpected worker object from the router ({exc!r}): {dict(data)}") from exc


def parse_workers(data: Any) -> list[WorkerInfo]:
    """The body of ``GET /workers``."""
    if not isinstance(data, dict) or not isinstance(data.get("workers"), list):
        raise RouterApiError(f"GET /workers: expected {{'workers': [...]}}, got {data!r}")
    return [parse_worker(w) for w in data["workers"]]


_IN_PROGRESS = re.compile(r"already in progress for URL '[^']*' with ID ([0-9A-Za-z-]+)\.")
_EXISTS = re.compile(r"already exists at URL '[^']*' with ID ([0-9A-Za-z-]+)\.")


def _error(response: httpx.Response) -> tuple[str | None, str]:
    """smg's error body ``{"error": …, "code": "WORKER_NOT_FOUND"}``: its code (None without one) and its message."""
    try:
        body = response.json()
    except ValueError:
        return None, ""
    if not isinstance(body, dict):
        return None, ""
    return (str(body["code"]) if "code" in body else None), str(body.get("error", ""))


def _in_progress_id(response: httpx.Response) -> str | None:
    """The pending registration's id from smg's 409 ``WORKER_CREATE_IN_PROGRESS``; None for any other answer."""
    code, message = _error(response)
    if code != "WORKER_CREATE_IN_PROGRESS":
        return None
    found = _IN_PROGRESS.search(message)
    return found.group(1) if found else None


def _existing_id(response: httpx.Response) -> str | None:
    """The registered worker's id from smg's 409 ``WORKER_ALREADY_EXISTS`` ("Worker already exists at URL '…' with
    ID …", service.rs:267-274, raised by ``create_worker`` when the URL's reserved id is in the registry,
    service.rs:485-491); None for any other answer."""
    code, message = _error(response)
    if code != "WORKER_ALREADY_EXISTS":
        return None
    found = _EXISTS.search(message)
    return found.group(1) if found else None


def api_error(method: str, path: str, response: httpx.Response) -> RouterApiError:
    """The error for an answer the API does not promise: its status, smg's code and the start of its body."""
    return RouterApiError(
        f"{method} {path} answered {response.status_code}: {response.text[:300]}",
        status=response.status_code,
        code=_error(response)[0],
    )


def _body(method: str, path: str, response: httpx.Response) -> Any:
    """The JSON body of a promised answer; a body that does not parse is the API's error (a proxy's HTML page)."""
    try:
        return response.json()
    except ValueError as exc:
        raise RouterApiError(f"{method} {path}: body is not JSON ({exc}): {response.text[:300]}") from exc


def parse_only(text: str, names: tuple[str, ...], scraped_at: float = 0.0) -> MetricsSnapshot:
    """The samples of the families whose names start with one of ``names`` (their ``# TYPE`` lines kept). The
    router's listener carries ~500 lines, most of them per-path HTTP histograms the gates never read; parsing only
    what they read takes 6 ms instead of 21 here, and a soak reads the router four times a second; the fleet
    controller reads every instance's breakers at every tick."""
    kept = []
    for line in text.splitlines():
        words = line.split(maxsplit=3)
        name = words[2] if line.startswith("#") and len(words) > 2 else line
        if name.startswith(names):
            kept.append(line)
    return MetricsSnapshot.parse("\n".join(kept) + "\n", scraped_at)


# Calls in flight per router client, under httpx's 20 kept-alive connections. A rollout batch asks each router about
# its 410 workers at once (a POST, a DELETE, a job status each); all at once, httpx opened 100 connections, closed all
# but 20 after each wave and scanned its pool per request: 55 % of the updater's CPU at 2,048 replicas (py-spy), in
# connection set-up (the router's too) and ``httpcore``'s pool bookkeeping.
AT_ONCE = 16


class RouterClient:
    """Async client for one router: worker API on ``base_url``, metrics on ``metrics_url``."""

    def __init__(self, base_url: str, metrics_url: str, *, timeout_s: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.metrics_url = metrics_url
        self._http = http_client(timeout=timeout_s)
        self._slots = asyncio.Semaphore(AT_ONCE)

    async def __aenter__(self) -> RouterClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        """One call, at most :data:`AT_ONCE` in flight: the rest wait here, outside httpx's pool and time-outs."""
        async with self._slots:
            return await self._http.request(method, url, **kwargs)

    async def _json(self, method: str, path: str, expect: Iterable[int], **kwargs: Any) -> Any:
        response = await self._request(method, self.base_url + path, **kwargs)
        if response.status_code not in set(expect):
            raise api_error(method, path, response)
        return _body(method, path, response)

    async def add_worker(self, url: str, *, existing_ok: bool = False) -> str:
        """Queue the registration of ``url``; returns the worker id (202 Accepted), or the id of the registration of
        ``url`` already queued: ``GET /workers`` does not list a pending registration, so an addition retried while
        the first waits for its worker POSTs again, and smg 1.13.0 answers 409 ``WORKER_CREATE_IN_PROGRESS`` with the
        pending one's id in its message only (``CreateInProgress``, model_gateway/src/worker/service.rs:275-282 and
        507-511 of the 1.13.0 sdist). With ``existing_ok`` a URL that is registered already (409
        ``WORKER_ALREADY_EXISTS``, service.rs:485-491: a registration that ended between the caller's list and this
        POST) answers that worker's id: the addition is done, or its caller's check of that id says why not (a draining
        entry). Without it that 409 raises, as it did for every caller before."""
        response = await self._request("POST", self.base_url + "/workers", json={"url": url})
        if response.status_code == 409 and (pending := _in_progress_id(response)) is not None:
            return pending
        if existing_ok and response.status_code == 409 and (existing := _existing_id(response)) is not None:
            return existing
        if response.status_code != 202:
            raise api_error("POST", "/workers", response)
        return str(_body("POST", "/workers", response)["worker_id"])

    async def list_workers(self) -> list[WorkerInfo]:
        return parse_workers(await self._json("GET", "/workers", (200,)))

    async def get_worker(self, worker_id: str) -> WorkerInfo | None:
        """The worker, or a pending registration (``job_status``); None when the router has neither."""
        response = await self._request("GET", f"{self.base_url}/workers/{worker_id}")
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise api_error("GET", f"/workers/{worker_id}", response)
        return parse_worker(_body("GET", f"/workers/{worker_id}", response))

    async def remove_worker(self, worker_id: str) -> bool:
        """Queue the removal (202: True). New requests stop going to it at once; in-flight ones finish. False when
        the router holds no such worker (404 ``WORKER_NOT_FOUND``): another removal took it out of the registry since
        it was listed. That id is gone; its URL may be registered again under a new one (the caller's to check)."""
        response = await self._request("DELETE", f"{self.base_url}/workers/{worker_id}")
        if response.status_code == 202:
            return True
        if response.status_code == 404 and _error(response)[0] == "WORKER_NOT_FOUND":
            return False  # already out: smg's delete_worker finds no URL for the id (service.rs:681-686)
        raise api_error("DELETE", f"/workers/{worker_id}", response)

    async def find_worker(self, url: str) -> WorkerInfo | None:
        """The registered worker serving ``url``, from one full list (ready and draining workers, not pending ones):
        the only way to learn the id of a worker this client did not add."""
        return next((w for w in await self.list_workers() if w.url == url.rstrip("/")), None)

    async def wait_for_worker(self, worker_id: str, *, timeout_s: float = 30.0, poll_s: float = 0.1) -> WorkerInfo:
        """Poll ``GET /workers/{id}`` until the worker is ready and healthy; raise RouterApiError when the router
        dropped its registration (404: the job gave up) and TimeoutError past ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            worker = await self.get_worker(worker_id)
            if worker is None:
                raise RouterApiError(
                    f"worker {worker_id}: the router dropped its registration (GET /workers/{worker_id} is 404: the "
                    "job gave up after --worker-startup-timeout-secs); its log names the health check that failed"
                )
            if worker.status == "ready" and worker.is_healthy:
                return worker
            if time.monotonic() >= deadline:
                raise TimeoutError(f"worker {worker.url} still {worker.status} after {timeout_s:.1f} s")
            await asyncio.sleep(poll_s)

    async def wait_for_removal(self, worker_id: str, *, timeout_s: float = 10.0, poll_s: float = 0.1) -> None:
        """Poll ``GET /workers/{id}`` until it is 404: drained and out of the registry."""
        deadline = time.monotonic() + timeout_s
        while (worker := await self.get_worker(worker_id)) is not None:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"worker {worker.url} still {worker.status} {timeout_s:.1f} s after its removal")
            await asyncio.sleep(poll_s)

    async def loads(self) -> dict[str, int]:
        """``GET /get_loads``: per worker URL, the requests running and waiting on it (summed over its data-parallel
        ranks) as the router's last poll of the worker's SGLang ``/v1/loads`` showed them (every
        ``--load-monitor-interval``): the figures ``power_of_two`` and overload protection act on."""
        body = await self._json("GET", "/get_loads", (200,))
        try:
            out: dict[str, int] = {}
            for rank in body["loads"]:
                url = str(rank["worker"])
                out[url] = out.get(url, 0) + int(rank["num_running_reqs"]) + int(rank["num_waiting_reqs"])
        except (KeyError, TypeError, ValueError) as exc:
            raise RouterApiError(f"GET /get_loads: unexpected body ({exc!r}): {str(body)[:300]}") from exc
        return out

    async def metrics(self, only: tuple[str, ...] = ()) -> MetricsSnapshot:
        """One scrape of the router's Prometheus listener; ``only``: just the families whose names start with one of
        these (:func:`parse_only`)."""
        return await self.scrape(self.metrics_url, only)

    async def worker_metrics(self, worker_url: str) -> MetricsSnapshot:
        """One scrape of a worker's ``/metrics`` (SGLang names)."""
        return await self.scrape(worker_url.rstrip("/") + "/metrics")

    async def scrape(self, url: str, only: tuple[str, ...] = ()) -> MetricsSnapshot:
        response = await self._request("GET", url)
        response.raise_for_status()
        if only:
            return parse_only(response.text, only, time.monotonic())
        return MetricsSnapshot.parse(response.text, time.monotonic())

    async def wait_until_idle(
        self, worker_url: str, *, timeout_s: float = 60.0, poll_s: float = 0.1, while_healthy: bool = False
    ) -> float:
        """Poll the worker's ``sglang:num_running_reqs`` + ``sglang:num_queue_reqs`` (each scheduler once) until both
        are 0.

        The router's DELETE does not wait for in-flight requests; call this before stopping the worker. With
        ``while_healthy``, wait only while the worker's ``/health`` answers 200 (in SGLang a one-token generation:
        its scheduler still produces output) and give up (TimeoutError) once it does not: a wedged scheduler's
        requests never end, while its HTTP server and ``/metrics`` still answer. Returns the seconds waited.
        """
        started = time.monotonic()
        base = worker_url.rstrip("/")
        while True:
            snap = await self.worker_metrics(worker_url)
            busy = sum(snap.per_scheduler(WORKER_RUNNING).values()) + sum(snap.per_scheduler(WORKER_QUEUED).values())
            if busy == 0:
                return time.monotonic() - started
            if (
                while_healthy
                and (status := (await self._request("GET", base + SCHEDULER_HEALTH_PATH)).status_code) != 200
            ):
                raise TimeoutError(
                    f"worker {worker_url}: {busy:.0f} requests in flight and {SCHEDULER_HEALTH_PATH} answers {status}: "
                    "its scheduler produces nothing, they will not finish"
                )
            if time.monotonic() - started >= timeout_s:
                raise TimeoutError(f"worker {worker_url} still has {busy:.0f} requests after {timeout_s:.1f} s")
            await asyncio.sleep(poll_s)
