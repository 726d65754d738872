"""The package's HTTP clients: one TLS context per process (serving.fleet_http.http_client)."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import certifi
import pytest

from serving.fleet_http import ca_tls, client_tls, http_client


async def _make(n: int) -> None:
    for _ in range(n):
        await http_client(timeout=1.0).aclose()


def test_making_clients_reads_the_ca_bundle_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """httpx reads and parses the CA bundle for every client it makes unless it is given a context: http_client
    gives it the process's one, so ten clients read the bundle at most once (none once the context exists)."""
    loads: list[object] = []
    real = ssl.SSLContext.load_verify_locations

    def counted(self: ssl.SSLContext, *args: object, **kwargs: object) -> None:
        loads.append(args or kwargs)
        real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counted)
    client_tls.cache_clear()
    asyncio.run(_make(10))
    assert len(loads) == 1, loads
    asyncio.run(_make(10))
    assert len(loads) == 1, loads


def test_the_shared_context_verifies_as_httpx_default_does() -> None:
    ctx = client_tls()
    assert ctx.verify_mode is ssl.CERT_REQUIRED and ctx.check_hostname
    assert ctx.cert_store_stats()["x509_ca"] > 0  # a CA bundle is loaded
    assert (
        http_client(verify=False)._transport._pool._ssl_context.verify_mode is ssl.CERT_NONE
    )  # an explicit verify stands


def test_a_ca_path_is_trusted_as_a_file_or_a_directory(tmp_path: Path) -> None:
    """A CA given by path (the Kubernetes clients' --kube-ca-file, the Lease election's ca_path): a bundle file is
    loaded at once, a directory of hashed certificates looked up per connection (as httpx took a ``verify`` path);
    none given: the process's shared context. A missing file fails at once, naming it."""
    bundle = tmp_path / "ca.crt"
    bundle.write_text(Path(certifi.where()).read_text())
    assert ca_tls(str(bundle)).cert_store_stats()["x509_ca"] > 0
    directory = ca_tls(str(tmp_path))
    assert directory.verify_mode is ssl.CERT_REQUIRED and directory.cert_store_stats()["x509_ca"] == 0
    assert ca_tls(None) is client_tls()
    with pytest.raises(FileNotFoundError):
        ca_tls(str(tmp_path / "missing.crt"))
