"""Sandbox port blocks lie outside the kernel's ephemeral range, so no outgoing connection (of this run or any
other process) can take a port between the check and the worker's bind."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

import pytest

from serving.sandbox.processes import (
    EPHEMERAL_PORT_RANGE,
    LINUX_EPHEMERAL_DEFAULT,
    ephemeral_port_range,
    free_port_block,
)


def test_the_range_is_read_from_the_kernel(tmp_path: Path) -> None:
    low, high = (int(v) for v in EPHEMERAL_PORT_RANGE.read_text().split())
    assert ephemeral_port_range() == (low, high)
    custom = tmp_path / "ip_local_port_range"
    custom.write_text("49152\t65535\n")
    assert ephemeral_port_range(custom) == (49152, 65535)
    assert ephemeral_port_range(tmp_path / "absent") == LINUX_EPHEMERAL_DEFAULT == (32768, 60999)


@pytest.mark.parametrize("count", [1, 10, 34])
def test_block_is_free_and_outside_the_ephemeral_range(count: int) -> None:
    low, high = ephemeral_port_range()
    base = free_port_block(count)
    ports = range(base, base + count)
    assert all(p < low or p > high for p in ports), (base, count, (low, high))
    assert ports[-1] <= 65535
    with contextlib.ExitStack() as stack:  # every port of the block is bindable now
        for port in ports:
            stack.enter_context(socket.socket()).bind(("127.0.0.1", port))


def test_a_taken_port_moves_the_block() -> None:
    base = free_port_block(3)
    with socket.socket() as held:
        held.bind(("127.0.0.1", base + 1))
        held.listen()
        again = free_port_block(3)
    assert not again <= base + 1 < again + 3
