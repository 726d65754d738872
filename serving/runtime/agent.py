"""The node agent: every heartbeat interval, probe this node's replicas and send ONE report for the node.

Per replica: ``GET /health_generate`` bounded by ``serving.health_check_timeout_s`` (a one-token generation through
the scheduler, ≥ 1 s on SGLang 0.5.23: a wedged scheduler or a hung process times out; the routers check the cheap
``/health``, serving.render.sglang), then ``GET /metrics`` for SGLang's load figures (``sglang:num_running_reqs``,
``sglang:num_queue_reqs``, ``sglang:token_usage``, ``sglang:num_requests_total``; the scheduler's gauges counted
once per data-parallel rank, :meth:`serving.router.client.MetricsSnapshot.per_scheduler`). GPU utilisation and
PCIe throughput come from NVIDIA's DCGM exporter when ``dcgm_url`` is given (averaged over the replica's GPUs);
without it GPU utilisation is estimated as running requests over ``limits.max_running_requests`` and network as 0.
Memory is SGLang's token usage (its KV pool's fill) either way: DCGM's frame-buffer use is the pool SGLang allocated
at start-up (``--mem-fraction-static``), ~0.9 on an idle replica (docs/runtime.md).

The report goes to every controller instance (followers keep warm state); a controller that does not
answer is skipped, the next interval's report supersedes this one.

Its HTTP is :class:`serving.fleet_http.FleetHttp` (aiohttp): a probe costs 0.28 ms of CPU there, 7.3 ms on httpx,
which matters where one process runs the agents of many nodes (the rehearsal, docs/scale.md). Its requests name
themselves ``User-Agent: exaserve-agent/VERSION``, as SGLang's access log shows them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from serving.fleet_http import VERSION, FleetHttp, HttpFailure
from serving.plan.model import Fleet
from serving.router.client import WORKER_QUEUED, WORKER_REQUESTS_TOTAL, WORKER_RUNNING, MetricsSnapshot, parse_only
from serving.runtime.controller import replica_urls
from serving.runtime.discovery import DiscoveryError, NodePods
from serving.runtime.reports import REPORT_SCHEMA_VERSION, NodeReport, ReplicaProbe
from serving.sglang_health import SCHEDULER_HEALTH_PATH
from serving.sglang_metrics import INTER_TOKEN_LATENCY, gaps_over

REPORTS_PATH = "/v1/reports"
WORKER_TOKEN_USAGE = "sglang:token_usage"  # noqa: S105 - a metric name, not a secret
DCGM_GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"  # percent
DCGM_PCIE_TX = "DCGM_FI_DEV_PCIE_TX_THROUGHPUT"  # KB/s
DCGM_PCIE_RX = "DCGM_FI_DEV_PCIE_RX_THROUGHPUT"  # KB/s
# What a probe reads of the replica's /metrics: parsing only these families takes a tenth of the full text's time
# (a server's latency histograms are most of it), which at 256 replicas per agent process is most of its CPU.
# SGLang's per-request time per output token (decode time ÷ (completion tokens − 1), observed for requests that
# finished by stop or length: queueing, prefill and aborts excluded; tokenizer_manager.py collect_metrics), read by its
# _sum and _count alone (the buckets are most of the exposition's lines): the controller's latency-outlier signal
WORKER_TPOT_SECONDS = "sglang:request_time_per_output_token_seconds_sum"
WORKER_TPOT_REQUESTS = "sglang:request_time_per_output_token_seconds_count"
# ... and its inter-token latency histogram, buckets and all (serving.sglang_metrics): the stall signal
PROBED_METRICS = (
    WORKER_RUNNING, WORKER_QUEUED, WORKER_TOKEN_USAGE, WORKER_REQUESTS_TOTAL, WORKER_TPOT_SECONDS,
    WORKER_TPOT_REQUESTS, INTER_TOKEN_LATENCY,
)  # fmt: skip
AGENT_USER_AGENT = f"exaserve-agent/{VERSION}"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentConfig:
    node: str
    replicas: tuple[tuple[str, str, tuple[int, ...]], ...]  # (id, url, GPU indices)
    controllers: tuple[str, ...]
    interval_s: float
    timeout_s: float
    max_running_requests: int
    link_rate_gbps: float
    dcgm_url: str | None = None
    controller_service: str | None = None  # HOST:PORT of a headless Service: every address it resolves to

    @classmethod
    def for_node(
        cls,
        fleet: Fleet,
        node: str,
        controllers: Sequence[str],
        dcgm_url: str | None = None,
        controller_service: str | None = None,
    ) -> AgentConfig:
        urls = replica_urls(fleet.plan)
        mine = [r for r in fleet.plan.replicas if r.node.name == node]
        if not mine:
            known = sorted({r.node.name for r in fleet.plan.replicas})
            raise ValueError(f"node {node!r} runs no replica of this stack; use one of {known[:8]}")
        return cls(
            node=node,
            replicas=tuple((r.id, urls[r.id], r.gpu_ids) for r in mine),
            controllers=tuple(c.rstrip("/") for c in controllers),
            interval_s=fleet.spec.serving.heartbeat_interval_s,
            timeout_s=fleet.spec.serving.health_check_timeout_s,
            max_running_requests=fleet.spec.limits.max_running_requests,
            link_rate_gbps=fleet.spec.cluster.fabric.link_rate_gbps,
            dcgm_url=dcgm_url,
            controller_service=controller_service,
        )


BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id(path: Path = BOOT_ID) -> str:
    """This machine's boot id: with the monotonic clock it orders the node's reports, whatever its wall clock does."""
    return path.read_text().strip()


@dataclass(frozen=True)
class Boot:
    """The node's boot as its reports carry it: the boot id, and the monotonic clock's reading at the boot (0 on a
    real machine: CLOCK_MONOTONIC counts from the kernel's start), so that ``seq`` is the time since the boot."""

    id: str
    at_ns: int = 0

    @classmethod
    def of_this_machine(cls) -> Boot:
        return cls(boot_id())

    @classmethod
    def simulated(cls, path: Path) -> Boot:
        """SIMULATION ONLY: the sandbox's nodes share one kernel, so its reboot drill writes ``path`` (JSON:
        ``boot_id``, and ``booted_at_ns``, the shared monotonic clock at the simulated boot) for the agent it starts
        after one (``exaserve agent run --simulated-boot``, a hidden option)."""
        data = json.loads(path.read_text())
        return cls(str(data["boot_id"]), int(data["booted_at_ns"]))

    def seq(self) -> int:
        return time.monotonic_ns() - self.at_ns


def _share(value: float) -> float:
    return max(0.0, min(1.0, value))


def _token_gaps(snap: MetricsSnapshot) -> dict[float, float] | None:
    """The replica's tokens that came longer than a stall bound after their request's last output, per bound, summed over
    its ``sglang:inter_token_latency_seconds`` series; None before the histogram has a series (no output after a
    first one yet: SGLang creates a labelled series at its first observation)."""
    itl = snap.histogram(INTER_TOKEN_LATENCY)
    return gaps_over(itl.buckets, itl.count) if itl.buckets else None


class Agent:
    """One node's agent; :meth:`report` probes, :meth:`send` reports, :meth:`run` does both every interval."""

    def __init__(self, config: AgentConfig, pods: NodePods | None = None, boot: Boot | None = None) -> None:
        """``pods``: on Kubernetes, the node's serving pods replace the plan's replicas (listed every report);
        ``boot``: this machine's unless given (:meth:`Boot.simulated`)."""
        self.config = config
        self.pods = pods
        self.boot = boot or Boot.of_this_machine()
        self._http = FleetHttp(timeout_s=config.timeout_s, user_agent=AGENT_USER_AGENT)
        self._lookup: asyncio.Task[list[str]] | None = None  # the controllers' Service, resolving (one at a time)
        self._service_addresses: list[str] = []  # what it last resolved to

    async def aclose(self) -> None:
        if self._lookup is not None:
            self._lookup.cancel()
        await self._http.aclose()
        if self.pods is not None:
            await self.pods.aclose()

    async def _probe(self, rid: str, url: str, gpus: tuple[int, ...], dcgm: MetricsSnapshot | None) -> ReplicaProbe:
        started = time.monotonic()
        try:
            health = await self._http.get(url + SCHEDULER_HEALTH_PATH)
            latency = time.monotonic() - started
            if health.status != 200:
                return ReplicaProbe(
                    id=rid, ok=False, latency_s=latency, error=f"{SCHEDULER_HEALTH_PATH} {health.status}"
                )
            metrics = await self._http.get(url + "/metrics")
            snap = parse_only(metrics.text, PROBED_METRICS) if metrics.status == 200 else MetricsSnapshot(())
        except HttpFailure as exc:
            return ReplicaProbe(id=rid, ok=False, latency_s=None, error=exc.why)
        running = sum(snap.per_scheduler(WORKER_RUNNING).values())
        usage = snap.per_scheduler(WORKER_TOKEN_USAGE).values()  # each DP rank's own pool: the fullest one counts
        gpu, net = self._gpu_figures(gpus, dcgm)
        return ReplicaProbe(
            id=rid,
            ok=True,
            latency_s=latency,
            running=int(running),
            queued=int(sum(snap.per_scheduler(WORKER_QUEUED).values())),
            requests_total=snap.value(WORKER_REQUESTS_TOTAL),
            # summed over the tokenizer's series (is_streaming, priority): a histogram's sums and counts add up
            tpot_seconds_total=snap.value(WORKER_TPOT_SECONDS) if snap.select(WORKER_TPOT_SECONDS) else None,
            tpot_requests_total=snap.value(WORKER_TPOT_REQUESTS) if snap.select(WORKER_TPOT_REQUESTS) else None,
            token_gaps_over_s=_token_gaps(snap),
            gpu_utilization=_share(running / self.config.max_running_requests) if gpu is None else gpu,
            # the KV pool's fill, never DCGM's frame-buffer use: SGLang allocates its pool at start-up
            # (--mem-fraction-static), so an idle replica's GPU memory reads ~0.9 and a shed one never looked idle
            memory_usage=_share(max(usage, default=0.0)),
            network_bandwidth=net or 0.0,
        )

    def _gpu_figures(self, gpus: tuple[int, ...], dcgm: MetricsSnapshot | None) -> tuple[float | None, float | None]:
        """(GPU utilisation, PCIe share of the link) averaged over ``gpus``, from DCGM."""
        if dcgm is None or not gpus:
            return None, None

        def per_gpu(name: str) -> list[float]:
            by_gpu = dcgm.by_label(name, "gpu")
            return [by_gpu[str(g)] for g in gpus if str(g) in by_gpu]

        util = per_gpu(DCGM_GPU_UTIL)
        pcie = [tx + rx for tx, rx in zip(per_gpu(DCGM_PCIE_TX), per_gpu(DCGM_PCIE_RX), strict=False)]
        link_kbps = self.config.link_rate_gbps * 1e9 / 8 / 1e3
        return (
            _share(sum(util) / len(util) / 100) if util else None,
            _share(sum(pcie) / len(pcie) / link_kbps) if pcie and link_kbps > 0 else None,
        )

    async def _dcgm(self) -> MetricsSnapshot | None:
        if self.config.dcgm_url is None:
            return None
        try:
            response = await self._http.get(self.config.dcgm_url)
        except HttpFailure as exc:
            log.warning("DCGM exporter %s: %s; falling back to SGLang's figures", self.config.dcgm_url, exc.why)
            return None
        if response.status != 200:
            log.warning(
                "DCGM exporter %s answered %d; falling back to SGLang's figures", self.config.dcgm_url, response.status
            )
            return None
        return MetricsSnapshot.parse(response.text)

    async def report(self) -> NodeReport:
        """Probe every replica of the node once (concurrently) and build the node's report."""
        dcgm = await self._dcgm()
        replicas = self.config.replicas if self.pods is None else await self.pods.replicas()
        probes = await asyncio.gather(*(self._probe(rid, url, g, dcgm) for rid, url, g in replicas))
        if self.pods is not None:  # the controller learns the pods from the reports
            probes = [p.model_copy(update={"url": url}) for p, (_rid, url, _g) in zip(probes, replicas, strict=True)]
        return NodeReport(
            schema_version=REPORT_SCHEMA_VERSION,
            node=self.config.node,
            boot_id=self.boot.id,
            seq=self.boot.seq(),
            sent_at=time.time(),
            replicas=tuple(probes),
        )

    async def send(self, report: NodeReport) -> Mapping[str, int]:
        """POST the report to every controller; status per controller (0: unreachable)."""
        body = report.model_dump_json().encode()

        async def one(controller: str) -> int:
            try:
                return (await self._http.post(controller + REPORTS_PATH, body)).status
            except HttpFailure:
                return 0

        targets = [*self.config.controllers, *await self._resolved()]
        codes = await asyncio.gather(*(one(c) for c in targets))
        return dict(zip(targets, codes, strict=True))

    async def _resolved(self) -> list[str]:
        """Every address of the controllers' headless Service (one per controller pod), resolved per report within the
        probe timeout; a lookup that fails or is still running then (a slow DNS) leaves the addresses it last
        resolved to, and a lookup still running is awaited again by the next report rather than started twice (each
        runs in a thread of the loop's executor). A lookup that ends after its report stopped waiting still counts:
        its addresses are kept, its error retrieved (:meth:`_looked_up`)."""
        if self.config.controller_service is None:
            return []
        if self._lookup is None or self._lookup.done():
            self._lookup = asyncio.create_task(self._lookup_service(self.config.controller_service))
            self._lookup.add_done_callback(self._looked_up)
        try:
            await asyncio.wait_for(asyncio.shield(self._lookup), self.config.timeout_s)
        except TimeoutError:
            log.warning(
                "controller service %s: not resolved within %g s; sending to the %d address(es) it last resolved to",
                self.config.controller_service,
                self.config.timeout_s,
                len(self._service_addresses),
            )
        except (OSError, ValueError) as exc:  # ValueError: a name idna refuses, a port that is not a number
            log.warning(
                "controller service %s: %s; sending to the %d address(es) it last resolved to",
                self.config.controller_service,
                exc,
                len(self._service_addresses),
            )
        return list(self._service_addresses)

    def _looked_up(self, lookup: asyncio.Task[list[str]]) -> None:
        """A lookup's end, awaited or not: its addresses replace the last ones; a failure is retrieved here, so it is
        never left for the loop to report as unretrieved (what the resolver says, OSError or ValueError, the report
        that awaited it logs; one that ended after its report stopped waiting was logged as not resolved in time)."""
        if lookup.cancelled():
            return
        error = lookup.exception()
        if error is None:
            self._service_addresses = lookup.result()
        elif not isinstance(error, OSError | ValueError):  # those the report that awaits it logs; the rest is a bug
            log.warning("controller service %s: a lookup failed: %r", self.config.controller_service, error)

    @staticmethod
    async def _lookup_service(service: str) -> list[str]:
        host, _, port = service.rpartition(":")
        infos = await asyncio.get_running_loop().getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
        addresses = sorted({str(info[4][0]) for info in infos})
        return [f"http://[{a}]:{port}" if ":" in a else f"http://{a}:{port}" for a in addresses]

    async def run(self, stop: asyncio.Event) -> None:
        """Report every ``interval_s`` on a fixed schedule: a slow probe does not shift the next one, and a report is
        sent while the next round waits, so a controller that does not answer (its send waits out the timeout) does
        not stretch the heartbeat: awaited in the round, a failing probe (the timeout) and a hung controller (the
        timeout again) made a round of 6 s at prod's 3 s timeout against its 5 s interval. Each send runs to its own
        timeout (every call in it is bounded by ``timeout_s``); a report that arrives after a newer one is refused by
        the controllers as replayed, nothing worse. On stop the sends still in flight get ``timeout_s`` to finish."""
        due = time.monotonic()
        sending: set[asyncio.Task[Mapping[str, int]]] = set()
        try:
            while not stop.is_set():
                try:
                    report = await self.report()
                except DiscoveryError as exc:  # no report this interval: the controllers count it as missed
                    log.warning("%s: %s", self.config.node, exc)
                else:
                    task = asyncio.create_task(self.send(report))
                    sending.add(task)
                    task.add_done_callback(self._sent(sending))
                due += self.config.interval_s
                due = max(due, time.monotonic())  # after a stall, restart the schedule instead of bursting
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=due - time.monotonic())
        finally:
            if sending:
                _done, late = await asyncio.wait(set(sending), timeout=self.config.timeout_s)
                for task in late:
                    task.cancel()

    def _sent(self, sending: set[asyncio.Task[Mapping[str, int]]]) -> Callable[[asyncio.Task[Mapping[str, int]]], None]:
        """A send's end: off the in-flight set; an error other than a controller not answering (which ``send``
        counts as 0) is logged, not left unretrieved."""

        def done(task: asyncio.Task[Mapping[str, int]]) -> None:
            sending.discard(task)
            if not task.cancelled() and task.exception() is not None:
                log.error("%s: sending a report failed", self.config.node, exc_info=task.exception())

        return done
