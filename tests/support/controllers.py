"""The runtime layer's controller instances as the tests and benchmarks ask them: which one leads, observed."""

from __future__ import annotations

import time
from typing import Any

import httpx

from serving.runtime.service import STATUS_PATH
from serving.sandbox.runtime import controller_urls
from serving.spec.schema import FleetSpec


def status(url: str, timeout_s: float = 10) -> dict[str, Any]:
    """One controller instance's ``/v1/status``."""
    return dict(httpx.get(url + STATUS_PATH, timeout=timeout_s).json())


def leading_controller(spec: FleetSpec, timeout_s: float = 30, request_timeout_s: float = 10) -> dict[str, Any]:
    """The status of the instance that says it leads, with its ``url``: each instance of the stack asked in turn
    until one does; AssertionError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for url in controller_urls(spec):
            try:
                s = status(url, request_timeout_s)
            except httpx.HTTPError:
                continue
            if s["is_leader"]:
                return s | {"url": url}
        time.sleep(0.2)
    raise AssertionError(f"no controller of {controller_urls(spec)} leads after {timeout_s:g} s")
