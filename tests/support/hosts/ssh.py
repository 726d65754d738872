"""A host-key-verified paramiko connection to a test host, and a connect that must fail (a blackholed host): shared
by the CI tests (tests/test_testhosts.py: that it fails, and how) and the rehearsal (tests/rehearsal/test_hosts.py:
how soon)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import paramiko

from tests.support.hosts.netns import SshHost


def connect(host: SshHost, *, known_hosts: Path | None = None, timeout: float = 5.0) -> paramiko.SSHClient:
    """paramiko client that accepts only the host key in `known_hosts` (RejectPolicy)."""
    client = paramiko.SSHClient()
    client.load_host_keys(str(known_hosts or host.known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(
        host.address,
        port=host.port,
        username="root",
        key_filename=str(host.client_key),
        look_for_keys=False,
        allow_agent=False,
        timeout=timeout,
        banner_timeout=timeout,
        auth_timeout=timeout,
    )
    return client


@dataclass(frozen=True)
class Failed:
    error: TimeoutError | OSError
    seconds: float


def failed_connect(host: SshHost, *, timeout: float) -> Failed:
    """Connect to ``host``, which must not answer: the error and the seconds until it came (a connection made is an
    AssertionError)."""
    started = time.monotonic()
    try:
        connect(host, timeout=timeout).close()
    except (TimeoutError, OSError) as exc:
        return Failed(exc, time.monotonic() - started)
    raise AssertionError(f"{host.name} ({host.address}) answered SSH")
