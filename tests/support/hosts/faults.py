"""What can be wrong with one SSH test host. The default `HostFaults()` is a healthy node."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

# The tools the test hosts stub; `missing_tools` may name any of them.
STUBBED_TOOLS: tuple[str, ...] = ("nvidia-smi", "ibstat", "chronyc")


@dataclass(frozen=True)
class HostFaults:
    """Faults of one test host, each produced by a real mechanism where one exists here.

    Real mechanisms: `unreachable` (blackhole route in the node's network namespace),
    `old_kernel` (sshd runs under `setarch --uname-2.6`: every process on the node, the
    Python that runs Ansible modules included, sees a 2.6.x release from uname(2)),
    `cgroup_v2=False` (the node's mount namespace has a hybrid v1 layout at /sys/fs/cgroup
    instead of cgroup2), `missing_tools` (the tool is absent; a real binary of that name on
    this machine is masked with a non-executable bind mount inside the node), `kubelet_flags`
    (the node's own /etc/default/kubelet).

    Stubbed, because there is no GPU, HCA or NTP server here: the rest change what the stub
    `nvidia-smi`, `ibstat` and `chronyc` print, starting from the real samples in
    tests/data/probes.
    """

    unreachable: bool = False
    # reachable only from its peers: its replies to this machine are dropped (a blackhole route to the bridge's
    # address in its namespace), as a node behind a bastion (reach it with ProxyJump through a `bastion` peer)
    behind_bastion: bool = False
    # its sshd forwards TCP (AllowTcpForwarding yes): a jump host; every other test host refuses to
    bastion: bool = False
    old_kernel: bool = False
    # The kubelet's KUBELET_EXTRA_ARGS in /etc/default/kubelet (a tmpfs over /etc/default in the node's mount
    # namespace holding only that file); None leaves the machine's /etc/default as it is.
    kubelet_flags: str | None = None
    cgroup_v2: bool = True
    missing_tools: tuple[str, ...] = ()
    # ibstat: these CAs report their port State: Down / Physical state: Polling.
    ib_down: tuple[str, ...] = ()
    # ibstat: every other InfiniBand port reports this Rate (sample: 400).
    ib_rate_gbps: int | None = None
    # ibstat: (CA, port, Gb/s) - that one port of that one CA reports this Rate, the others keep theirs.
    ib_port_rates: tuple[tuple[str, int, int], ...] = ()
    # These stub tools never answer (sleep until killed), as nvidia-smi does on a wedged GPU.
    hangs: tuple[str, ...] = ()
    # chronyc: system clock minus NTP time in seconds, positive = ahead (sample: -0.000006523).
    clock_offset_s: float | None = None
    chrony: Literal["synchronised", "unsynchronised", "stopped"] = "synchronised"
    # nvidia-smi: GPUs listed (sample: 8; 0 prints "No devices were found").
    gpu_count: int | None = None
    gpu_memory_used_mib: int | None = None
    nvidia_driver_failed: bool = False
    driver_version: str | None = None
    cuda_version: str | None = None

    def __post_init__(self) -> None:
        # Accept lists for the tuple fields; a HostFaults must stay hashable (fleets are cached by it).
        object.__setattr__(self, "missing_tools", tuple(self.missing_tools))
        object.__setattr__(self, "ib_down", tuple(self.ib_down))
        object.__setattr__(self, "ib_port_rates", tuple(tuple(rate) for rate in self.ib_port_rates))
        object.__setattr__(self, "hangs", tuple(self.hangs))
        for name, tools in (("missing_tools", self.missing_tools), ("hangs", self.hangs)):
            unknown = sorted(set(tools) - set(STUBBED_TOOLS))
            if unknown:
                raise ValueError(f"{name}={unknown}: only {list(STUBBED_TOOLS)} are stubbed")
        both = sorted(set(self.missing_tools) & set(self.hangs))
        if both:
            raise ValueError(f"{both} cannot be both missing and hanging")
        if self.gpu_count is not None and not 0 <= self.gpu_count <= 8:
            raise ValueError(f"gpu_count={self.gpu_count}: the sample node has 8 GPUs, use 0..8")

    def describe(self) -> str:
        """The non-default fields, e.g. `ib_down=('mlx5_0',), old_kernel=True`; `healthy` if none."""
        changed = [
            f"{field.name}={getattr(self, field.name)!r}"
            for field in dataclasses.fields(self)
            if getattr(self, field.name) != field.default
        ]
        return ", ".join(changed) or "healthy"
