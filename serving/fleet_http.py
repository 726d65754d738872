"""HTTP to every replica of the fleet at once: the node agents' probes, the updater's per-replica scrapes, health
probes and version reads. One keep-alive aiohttp session per caller.

Why not httpx, which the package uses for its other calls (a router's API, etcd, the Kubernetes API): a ``GET`` costs
about 2.5 ms of CPU on httpx's async client and 0.14 ms on aiohttp's, and httpx queues what exceeds its pool (100
connections) until ``PoolTimeout``. Measured against 256 simulated workers (``bench/scale_bench.py``,
``docs/scale.md``): an agent's probe (``/health``, ``/metrics``, parse) 7.3 ms → 0.28 ms; the updater's read of 2,048
replicas' ``/metrics`` took minutes and timed out, and takes under a second. A call that fails raises
:class:`HttpFailure` saying why in a word or two (``ConnectError``, ``Timeout 3 s``), the form the gates and reports
print per replica.

:func:`http_client` is the package's httpx client for those other calls: httpx builds a TLS context for every client
it makes (the CA bundle read and parsed: 56 ms of CPU here), even for plain-HTTP calls, and the fleet controller made
clients at every tick (its routers' breakers, each membership operation): the drill stack's three controllers took
0.8 of a core on 2 cores, three quarters of it in ``ssl.create_default_context``. One context per process, built as
httpx builds its default, serves every client.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import ssl
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import aiohttp
import httpx

VERSION = version("exaserve-deploy")
USER_AGENT = f"exaserve/{VERSION}"


@functools.cache
def client_tls() -> ssl.SSLContext:
    """httpx's default trust (``verify=True``: ``SSL_CERT_FILE`` or ``SSL_CERT_DIR`` when set, else certifi's bundle),
    built once per process."""
    return httpx.create_ssl_context()


def ca_tls(ca: str | None) -> ssl.SSLContext:
    """Trust ``ca`` (a CA bundle file, or a directory of hashed certificates, as httpx took a ``verify`` path), or
    :func:`client_tls` when none is given."""
    if not ca:
        return client_tls()
    return ssl.create_default_context(capath=ca) if os.path.isdir(ca) else ssl.create_default_context(cafile=ca)


def http_client(**kwargs: Any) -> httpx.AsyncClient:
    """``httpx.AsyncClient(**kwargs)`` on the process's one TLS context (:func:`client_tls`) unless ``verify`` is
    given: a client costs about 1 ms to make instead of 56."""
    kwargs.setdefault("verify", client_tls())
    return httpx.AsyncClient(**kwargs)


class HttpFailure(Exception):
    """No HTTP answer from ``url``: ``why`` is a word or two (the connection refused, the time-out)."""

    def __init__(self, url: str, why: str) -> None:
        super().__init__(f"{url}: {why}")
        self.url = url
        self.why = why


@dataclass(frozen=True)
class Answer:
    status: int
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


AT_ONCE = 256  # calls in flight per session: the connections fit the usual 1,024 open files of a process


class FleetHttp:
    """GET and POST to many servers at once, at most ``at_once`` in flight (the rest wait their turn, which their
    time-out does not count); ``timeout_s`` bounds each call: connect, send and the whole answer."""

    def __init__(self, *, timeout_s: float, user_agent: str = USER_AGENT, at_once: int = AT_ONCE) -> None:
        self.timeout_s = timeout_s
        self.user_agent = user_agent
        self._slots = asyncio.Semaphore(at_once)
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        """Made on first use, inside the running event loop (aiohttp binds a session to one)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=None),  # bounded by the slots instead
                headers={"User-Agent": self.user_agent},
            )
        return self._session

    async def get(self, url: str, *, timeout_s: float | None = None) -> Answer:
        return await self._call("GET", url, None, None, timeout_s)

    async def post(
        self, url: str, body: bytes, *, content_type: str = "application/json", timeout_s: float | None = None
    ) -> Answer:
        return await self._call("POST", url, body, content_type, timeout_s)

    async def _call(
        self, method: str, url: str, body: bytes | None, content_type: str | None, timeout_s: float | None
    ) -> Answer:
        limit = self.timeout_s if timeout_s is None else timeout_s
        headers = {"Content-Type": content_type} if content_type else None
        try:
            async with (
                self._slots,
                self._http().request(
                    method, url, data=body, headers=headers, timeout=aiohttp.ClientTimeout(total=limit)
                ) as response,
            ):
                return Answer(response.status, await response.text())
        except TimeoutError:
            raise HttpFailure(url, f"Timeout {limit:g} s") from None
        except aiohttp.ClientConnectorError:
            raise HttpFailure(url, "ConnectError") from None
        except aiohttp.ClientError as exc:
            raise HttpFailure(url, type(exc).__name__) from None

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> FleetHttp:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()
