"""Waiting on real processes without judging time: a patience bound is a liveness limit (the thing did not happen,
or hung), never a figure compared with a target. The CI suite waits through these; how long a thing took is judged
only in the rehearsal tier (tests/rehearsal/, scripts/rehearse.sh; tests/test_architecture_tiers.py keeps the rule).

When patience runs out, the failure says what was awaited and what was last seen, so a hang reads as a hang."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

T = TypeVar("T")

# How long the suite waits for a thing that takes seconds when the machine is quiet: many times its time, so that a
# loaded machine is slower, never failed (a thing this late has hung)
PATIENCE_S = 120.0


def wait_until(
    ready: Callable[[], T],
    *,
    what: str,
    patience_s: float = PATIENCE_S,
    every_s: float = 0.1,
    seen: Callable[[], object] | None = None,
) -> T:
    """Call ``ready`` every ``every_s`` until it returns something truthy, and return that; fail naming ``what`` and
    the last ``seen()`` (or the last value of ``ready``) when ``patience_s`` passed first."""
    deadline = time.monotonic() + patience_s
    while True:
        value = ready()
        if value:
            return value
        if time.monotonic() >= deadline:
            last = seen() if seen is not None else value
            pytest.fail(f"waited {patience_s:g} s for {what}; last seen: {last!r}", pytrace=False)
        time.sleep(every_s)


async def eventually(
    ready: Callable[[], Awaitable[T]],
    *,
    what: str,
    patience_s: float = PATIENCE_S,
    every_s: float = 0.05,
    seen: Callable[[], object] | None = None,
) -> T:
    """:func:`wait_until` for a coroutine on the running event loop: await ``ready()`` every ``every_s`` until it
    returns something truthy, and return that; fail naming ``what`` and the last ``seen()`` (or the last value of
    ``ready``) when ``patience_s`` passed first."""
    deadline = time.monotonic() + patience_s
    while True:
        value = await ready()
        if value:
            return value
        if time.monotonic() >= deadline:
            last = seen() if seen is not None else value
            pytest.fail(f"waited {patience_s:g} s for {what}; last seen: {last!r}", pytrace=False)
        await asyncio.sleep(every_s)


def finishes(call: Callable[[], T], *, what: str, patience_s: float = PATIENCE_S) -> T:
    """``call()``'s result, run in a thread: fails naming ``what`` when it has not returned after ``patience_s`` (it
    hangs: the thread is left behind, a daemon), and re-raises what it raised."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True, name=f"finishes: {what}")
    thread.start()
    thread.join(patience_s)
    if thread.is_alive():
        pytest.fail(f"{what} had not returned after {patience_s:g} s: it hangs", pytrace=False)
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]
