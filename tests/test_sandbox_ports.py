"""Sandbox ports lie outside the kernel's ephemeral range, so no outgoing connection (of this run or any other process)
can take a port between the check and the worker's bind: the ports tests and benchmarks pick (free_port_block,
free_ports), the sandbox stack's defaults, and ``sandbox up``, which refuses a stack whose ports lie inside this
machine's range, naming the field, its value, the range and the fix."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

import pytest

from serving.sandbox.processes import (
    EPHEMERAL_PORT_RANGE,
    FIRST_SANDBOX_PORT,
    LINUX_EPHEMERAL_DEFAULT,
    PORT_SEARCH_START,
    SandboxError,
    ephemeral_port_range,
    free_port_block,
    free_ports,
)
from serving.sandbox.scale import MachineTooSmall, check_ports, sandbox_ports
from serving.spec.stack import load_stack
from tests.support.cli import exaserve, flat
from tests.support.stacks import fleet_of, sandbox_stack_file


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


def test_a_search_start_puts_blocks_and_ports_at_or_above_it_and_a_bad_one_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Parallel test workers (tests/conftest.py) give each its own start: what they pick never overlaps."""
    low, _high = ephemeral_port_range()
    starts = [FIRST_SANDBOX_PORT + 500, min(low, 65536) - 600]
    picked = []
    for start in starts:
        monkeypatch.setenv(PORT_SEARCH_START, str(start))
        base, single = free_port_block(40), free_ports(1)[0]
        # at or above the start: the search steps on past ports another process holds, so how far above depends on
        # the machine (a clean-clone run under load once had 20700-21254 held by a scale sandbox beside it)
        assert start <= base and start <= single, (start, base, single)
        picked.append(set(range(base, base + 40)))
    assert not picked[0] & picked[1]
    monkeypatch.setenv(PORT_SEARCH_START, "twenty")
    with pytest.raises(SandboxError, match=f"{PORT_SEARCH_START}='twenty' is not a port number"):
        free_port_block(4)


def test_ports_handed_out_are_not_handed_out_again_before_they_are_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """A block's ports are bound later, by the processes started on them: a single port found next (a worker host's
    control port) must not be one of them, even from the same search start."""
    monkeypatch.setenv(PORT_SEARCH_START, str(FIRST_SANDBOX_PORT + 3000))
    base = free_port_block(16)
    single = free_ports(4)
    again = free_port_block(16)
    assert not set(single) & set(range(base, base + 16)), (base, single)
    assert not set(range(again, again + 16)) & set(range(base, base + 16)), (base, again)


def test_free_ports_are_distinct_bindable_and_outside_the_ephemeral_range() -> None:
    low, high = ephemeral_port_range()
    ports = free_ports(5)
    assert len(set(ports)) == 5
    assert all(FIRST_SANDBOX_PORT <= p <= 65535 and not low <= p <= high for p in ports), (ports, (low, high))
    with contextlib.ExitStack() as stack:
        for port in ports:
            stack.enter_context(socket.socket()).bind(("127.0.0.1", port))


@pytest.mark.parametrize("instances", [1, 3])
def test_the_sandbox_stacks_ports_lie_below_linuxs_range_and_apart_from_picked_blocks(instances: int) -> None:
    """The shipped stack (runtime layer and Prometheus on), with one router and controller or three of each."""
    spec = load_stack("sandbox").spec
    spec = spec.model_copy(update={"scheduler": spec.scheduler.model_copy(update={"instances": instances})})
    ports = [p for found in sandbox_ports(fleet_of(spec)).values() for p in found]
    # 8 workers, router 0 and its metrics; etcd client and peer, the controllers, routers 1… with metrics, Prometheus
    assert len(ports) == len(set(ports)) == 8 + 2 + 2 + instances + 2 * (instances - 1) + 1
    assert all(20000 <= p < FIRST_SANDBOX_PORT < LINUX_EPHEMERAL_DEFAULT[0] for p in ports), sorted(ports)


def test_ports_inside_the_ephemeral_range_are_refused_naming_field_value_range_and_fix(tmp_path: Path) -> None:
    spec = load_stack("sandbox").spec
    assert spec.sandbox is not None
    port_range = tmp_path / "ip_local_port_range"
    port_range.write_text("20050\t20100\n")  # the runtime block and the first worker
    with pytest.raises(MachineTooSmall) as refused:
        check_ports(fleet_of(spec), port_range)
    message = str(refused.value)
    assert message.startswith(
        "sandbox.worker_base_port=20100 (port 20100); sandbox.runtime_base_port=20050 (4 ports from 20050 to 20069) "
        f"inside this machine's ephemeral port range 20050-20100 ({port_range})"
    ), message
    assert "Move them below 20050 or above 20100" in message and "net.ipv4.ip_local_port_range" in message
    port_range.write_text("32768\t60999\n")
    check_ports(fleet_of(spec), port_range)


def test_sandbox_up_refuses_a_stack_in_the_ephemeral_range_before_starting_anything(tmp_path: Path) -> None:
    low, high = ephemeral_port_range()
    stack = sandbox_stack_file(tmp_path / "stack", ports_base=low + 100)
    result = exaserve("sandbox", "up", "--stack-file", str(stack), env={"EXASERVE_STATE_DIR": str(tmp_path / "state")})
    assert result.returncode == 2, result.stdout + result.stderr
    said = flat(result.stderr)
    assert said.startswith(
        f"error: sandbox of 'sandbox' not started: sandbox.worker_base_port={low + 100} (8 ports from {low + 100} to "
        f"{low + 107}); sandbox.router_port={low + 108} (port {low + 108}); sandbox.prometheus_port={low + 109} "
        f"(port {low + 109}) inside this machine's ephemeral port range {low}-{high}"
    ), said
