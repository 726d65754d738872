"""The scale sandbox's CPU bound (serving/sandbox/capacity.py, serving.sandbox.scale.check_machine): costs measured on
this machine with the real worker host and a real agent, turned into the steady state's cores from the stack's rates,
and a refusal that names the figure and the replicas this machine holds."""

from __future__ import annotations

import math
import subprocess
import tempfile
from pathlib import Path

import pytest

from serving.sandbox import capacity
from serving.sandbox import scale as scale_module
from serving.spec.schema import FleetSpec
from serving.spec.stack import load_stack, parse_spec
from tests.support.cli import exaserve, flat
from tests.support.paths import REPO
from tests.support.stacks import fleet_of

# The reference machine's own costs: a worker request of 0.12 ms and an agent probe of 0.5 ms in the fleet
REFERENCE = capacity.Costs(request_ms=0.12 / capacity.IN_FLEET, probe_ms=capacity.REFERENCE_PROBE_MS)


def simulated_prod() -> FleetSpec:
    prod = load_stack("prod")
    return parse_spec(scale_module.simulated_document(prod, fleet_of(prod.spec).plan, ports_base=21000), "prod", REPO)


def calibration_hosts(under: Path) -> list[str]:
    """The calibration's worker hosts still running from a temporary directory under ``under`` (this test's own: a
    calibration another test runs at the same time is not this one's)."""
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    return [
        line
        for line in ps.splitlines()
        if "serving.sandbox.worker_host" in line and f"{under}/exaserve-calibrate" in line
    ]


@pytest.mark.slow  # 10-35 s (a real worker host, agent or git repository): --fast leaves it out
def test_costs_are_measured_with_the_real_worker_host_and_agent_which_are_gone_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The calibration measures both costs (what they come to against their bounds is the rehearsal's:
    tests/rehearsal/test_capacity.py), turns them into the machine's speed, and leaves no worker host behind."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the calibration's temporary directory goes here
    costs = capacity.measure_costs(workers=16, probes=400)
    assert costs.request_ms > 0 and costs.probe_ms > 0, costs
    assert costs.speed == pytest.approx(costs.probe_ms / capacity.REFERENCE_PROBE_MS)
    assert calibration_hosts(tmp_path) == []


def test_at_the_reference_machines_costs_the_model_gives_its_measured_cores() -> None:
    """docs/scale.md, 2,048 replicas on the reference machine: worker processes 0.38, agents 0.20, controllers 0.11
    cores; the routers smg 1.13.0's, measured at 2,048 workers (bench/router_steady_bench.py: 0.0716 cores a router on a
    machine at 0.917 × the reference's CPU per unit of work, 0.078 on the reference; sglang-router 0.3.2 took 0.05).
    The model's rates: 3 routers × (/health + /v1/loads) + an agent's /health and /metrics per
    replica per 5 s heartbeat; 256 node reports per heartbeat at each of 3 controllers."""
    spec = simulated_prod()
    replicas, nodes, beat = 2048, 256, spec.serving.heartbeat_interval_s
    assert (spec.scheduler.instances, beat, spec.serving.heartbeat_mode) == (3, 5, "aggregated")
    need = capacity.cpu_need(spec, replicas, nodes, REFERENCE)
    assert need.cores["workers"] == pytest.approx(replicas / beat * (3 * 2 + 2) * 0.12e-3)  # 0.39
    assert need.cores["agents"] == pytest.approx(replicas / beat * 0.5e-3)  # 0.20
    assert need.cores["routers"] == pytest.approx(3 * 0.0716 / 0.917)  # 0.234
    assert need.cores["controllers"] == pytest.approx(0.11)
    assert need.total == pytest.approx(0.94, abs=0.01)
    slower = capacity.cpu_need(spec, replicas, nodes, capacity.Costs(REFERENCE.request_ms * 2, REFERENCE.probe_ms * 2))
    assert slower.total == pytest.approx(2 * need.total)  # every share scales with the machine's speed
    direct = spec.model_copy(update={"serving": spec.serving.model_copy(update={"heartbeat_mode": "direct"})})
    assert capacity.cpu_need(direct, replicas, nodes, REFERENCE).cores["controllers"] == pytest.approx(0.11 * 8)


def test_a_machine_too_slow_is_refused_naming_the_cores_and_the_replicas_it_holds() -> None:
    spec = simulated_prod()
    fl = fleet_of(spec)
    slow = capacity.Costs(REFERENCE.request_ms * 3, REFERENCE.probe_ms * 3)  # 2.8 cores at 2,048
    share = 0.5
    with pytest.raises(scale_module.MachineTooSmall) as refused:
        scale_module.check_machine(fl, costs=slow, cpu_share=share)
    message = flat(str(refused.value))
    need = capacity.cpu_need(spec, 2048, 256, slow, share)
    assert f"needs about {need.total:.2f} cores in its steady state" in message
    assert "0.84 ms per agent probe, 3.0× the reference machine's" in message
    fits = int(message.split("This machine holds about ")[1].split(" replicas")[0].replace(",", ""))
    assert fits % 8 == 0 and f"--replicas {fits}" in message
    # the largest whole number of nodes whose steady state fits
    assert capacity.cpu_need(spec, fits, fits // 8, slow, share).total <= need.available
    assert capacity.cpu_need(spec, fits + 8, fits // 8 + 1, slow, share).total > need.available
    assert math.isclose(need.available, share * capacity.cpus())
    fits_here = scale_module.check_machine(fl, costs=REFERENCE, cpu_share=1.0)  # 0.94 cores ≤ any CPU count
    assert fits_here.cpu is not None and fits_here.cpu.total == pytest.approx(0.94, abs=0.01)


@pytest.mark.slow  # 10-35 s (a real worker host, agent or git repository): --fast leaves it out
def test_sandbox_up_measures_then_refuses_a_sandbox_the_cores_cannot_hold(tmp_path: Path) -> None:
    """The whole prod stack at a 5 % CPU share: 2,048 replicas need ≥ 0.94 cores on the reference machine, more than
    5 % of 2 CPUs on any machine up to 8× faster; refused after the measurement, exit 2, nothing left running."""
    env = {"EXASERVE_STATE_DIR": str(tmp_path / "state"), "TMPDIR": str(tmp_path)}  # the calibration's directory
    r = exaserve("sandbox", "up", "--stack", "prod", "--simulate", "--cpu-share", "0.05", env=env, timeout_s=180)
    err = flat(r.stderr)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "measuring this machine's CPU costs" in err and "Traceback" not in err
    assert "needs about" in err and "more than 5% of its" in err and "This machine holds about" in err, err
    assert calibration_hosts(tmp_path) == []
    assert not list((tmp_path / "state" / "prod-simulated" / "sandbox").glob("*.json"))  # no process records
