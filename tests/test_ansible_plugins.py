"""The pure parts of preflight: report, fabric arithmetic, inventory variables, filters and the
parsers of the probe modules this issue adds, on real tool output (tests/data/container, real ping)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from serving.checks.preflight import CHECKS, ReportError, build_report, check_result, load_report, summary_lines
from serving.node import fabric
from serving.render import inventory
from serving.spec.stack import PROJECT_ROOT, load_stack
from tests.hosts.library import LIBRARY_DIR
from tests.hosts.library import load as load_module

DATA = Path(__file__).resolve().parent / "data" / "container"
ANSIBLE_DIR = PROJECT_ROOT / "ansible"


def _load_plugin(kind: str, name: str) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        f"exaserve_{kind}_{name}", ANSIBLE_DIR / "plugins" / kind / f"{name}.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------------------ report


def test_check_result_normalises_and_demands_a_fix_for_failures() -> None:
    assert check_result("kernel", {"passed": True, "observed": "6.8.0", "expected": ">= 5.15", "fix": "x"}) == {
        "status": "pass",
        "observed": "6.8.0",
        "expected": ">= 5.15",
        "fix": None,
    }
    assert check_result("ib_ports", {"skip": "ethernet fabric"})["status"] == "skip"
    with pytest.raises(ValueError, match="failed without a fix"):
        check_result("kernel", {"passed": False, "observed": "2.6.32"})
    with pytest.raises(ValueError, match="unknown preflight check 'kernal'"):
        check_result("kernal", {"passed": True})
    with pytest.raises(ValueError, match="must be a boolean"):
        check_result("kernel", {"passed": "False", "fix": "x"})


def _r(status: str, fix: str | None = None) -> dict[str, Any]:
    return {"status": status, "observed": "o", "expected": "e", "fix": fix}


def test_build_report_statuses_order_and_summary() -> None:
    report = build_report(
        "prod",
        {
            "a": {"kernel": _r("pass"), "ssh": _r("pass")},
            "b": {"ntp_offset": _r("fail", "chronyc makestep"), "ssh": _r("pass"), "ib_rate": _r("fail", "cable")},
            "c": {"ssh": _r("fail", "power it on")},
            "d": None,
            "e": {"ssh": _r("pass")},
        },
        aborted=["e"],
    )
    assert report["summary"] == {"hosts": 5, "passed": 1, "failed": 2, "unreachable": 2}
    assert report["ok"] is False
    assert report["hosts"]["b"]["failed_checks"] == ["ib_rate", "ntp_offset"]  # CHECKS order
    assert list(report["hosts"]["b"]["checks"]) == ["ssh", "ib_rate", "ntp_offset"]
    assert report["hosts"]["c"]["status"] == "unreachable"
    assert report["hosts"]["d"]["status"] == "unreachable"  # recorded nothing: reported, not passed
    assert report["hosts"]["e"]["failed_checks"] == ["play"]
    assert report["checks"] == [c for c in CHECKS if c in {"ssh", "play", "kernel", "ib_rate", "ntp_offset"}]
    lines = summary_lines(report)
    assert lines[0] == "preflight prod: 1/5 nodes pass, 2 failing, 2 unreachable"
    assert "b ntp_offset: o (expected e). Fix: chronyc makestep" in lines
    with pytest.raises(ValueError, match="aborted hosts"):
        build_report("prod", {"a": None}, aborted=["zz"])


def test_load_report_errors_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="no preflight report"):
        load_report(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 99, "hosts": {}}')
    with pytest.raises(ReportError, match="not a version 1 preflight report"):
        load_report(bad)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(build_report("dev", {"a": {"ssh": _r("pass")}})))
    assert load_report(good)["ok"] is True


# ------------------------------------------------------------------------------------------ fabric


def test_busbw_matches_nccl_tests_formula() -> None:
    # nccl-tests all_reduce_perf: 8 ranks, 1 GiB in 10 ms -> algbw 107.37 GB/s, busbw × 2·7/8 = 187.9 GB/s.
    algbw, busbw = fabric.bus_bandwidth(2**30, 0.010, 8)
    assert algbw == pytest.approx(107.374, rel=1e-4)
    assert busbw == pytest.approx(algbw * 1.75)
    assert fabric.bus_factor(2) == 1.0 and fabric.bus_factor(1) == 0.0
    with pytest.raises(ValueError, match="positive time"):
        fabric.bus_bandwidth(1, 0.0, 2)


def test_fabric_groups_pairs_racks_and_odd_node() -> None:
    nodes = [(f"n{i}", "r0" if i < 3 else "r1", f"10.0.0.{i + 1}") for i in range(5)]
    g = fabric.fabric_groups(nodes, 29500)
    assert g["n0"]["pair"] == {"group": "pair-0", "rank": 0, "world_size": 2, "master": "10.0.0.1:29500"}
    assert g["n4"]["pair"] == {"group": "pair-1", "rank": 2, "world_size": 3, "master": "10.0.0.3:29501"}
    assert g["n3"]["rack"] == {"group": "r1", "rank": 0, "world_size": 2, "master": "10.0.0.4:29503"}
    assert g["n2"]["rack"]["master"] == "10.0.0.1:29502"
    # A lone node has nothing to measure.
    assert fabric.fabric_groups([("solo", "r0", "10.0.0.1")], 1) == {}


def test_assess_uses_link_rate_and_the_source_utilisation_table() -> None:
    ok = fabric.assess(370.0, 400)
    assert ok.passed and ok.fix is None and "92% of the 400 Gb/s link" in ok.observed
    slow = fabric.assess(150.0, 400)
    assert not slow.passed
    assert "45%–60% GPU utilisation (≥ 100 Gb/s: small tensor parallel)" in (slow.fix or "")
    assert "80%–92% GPU utilisation (≥ 400 Gb/s: all strategies)" in (slow.fix or "")


def test_fabric_check_entries() -> None:
    group = {"group": "pair-0", "rank": 1, "world_size": 2, "master": "10.0.0.1:29500"}
    assert fabric.fabric_check("pair", None, None, link_rate_gbps=400)["skip"]
    err = fabric.fabric_check("pair", group, {"error": "DistNetworkError: timed out"}, link_rate_gbps=400)
    assert err["passed"] is False and "10.0.0.1:29500" in err["fix"] and "timed out" in err["observed"]
    good = fabric.fabric_check("rack", group, {"busbw_gbps": 390.0, "backend": "nccl"}, link_rate_gbps=400)
    assert good["check"] == "fabric_rack" and good["passed"] is True and "nccl" in good["observed"]


def test_gloo_allreduce_between_two_local_processes() -> None:
    """The worker itself, two ranks over loopback (the SSH-host test runs it between namespaces)."""
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    args = [sys.executable, "-m", "serving.node.fabric", "--world-size", "2", "--master", "127.0.0.1:29631",
            "--size-mib", "4", "--iterations", "5", "--timeout-s", "60"]  # fmt: skip
    procs = [
        subprocess.Popen([*args, "--rank", str(r)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for r in (0, 1)
    ]
    docs = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert {d["rank"] for d in docs} == {0, 1} and docs[0]["time_s"] == docs[1]["time_s"]  # max over ranks
    assert docs[0]["backend"] == "gloo" and docs[0]["busbw_gbs"] == pytest.approx(docs[0]["algbw_gbs"])  # n=2
    assert docs[0]["busbw_gbps"] > 0


def test_worker_reports_a_missing_peer_as_an_error_within_its_timeout() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "serving.node.fabric", "--rank", "1", "--world-size", "2", "--master", "127.0.0.1:29632",
         "--timeout-s", "2"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 1
    assert "timed out" in json.loads(r.stdout.strip().splitlines()[-1])["error"]


# ------------------------------------------------------------------------------------------ inventory


def test_inventory_vars_come_from_the_spec() -> None:
    st = load_stack("prod")
    v = inventory.fleet_vars(st)
    spec = st.spec
    assert v["exaserve_gpu_count"] == spec.cluster.gpu.count_per_node
    assert v["exaserve_hcas"] == spec.cluster.fabric.hcas
    assert v["exaserve_link_rate_gbps"] == spec.cluster.fabric.link_rate_gbps
    assert v["exaserve_ntp_max_offset_ms"] == spec.cluster.ntp.max_offset_ms
    assert v["exaserve_image_cuda"] == inventory.image_cuda(spec.serving.image)
    assert v["exaserve_model_store_dir"].startswith(spec.storage.model_store.mount_path)
    assert len(v["exaserve_racks"]) == spec.cluster.rack_count
    groups = inventory.groups(spec)
    assert len(groups["exaserve"]) == spec.cluster.node_count
    assert sum(len(m) for g, m in groups.items() if g in v["exaserve_racks"]) == spec.cluster.node_count


@pytest.mark.parametrize(
    ("image", "cuda"),
    [
        ("lmsysorg/sglang:v0.5.23-cu126", "12.6"),
        ("x/y:1.0-cuda118-py3", "11.8"),
        ("x/y:1.0", None),
        ("x/y@sha256:ab", None),
    ],
)
def test_image_cuda(image: str, cuda: str | None) -> None:
    assert inventory.image_cuda(image) == cuda


def test_limit_patterns() -> None:
    spec = load_stack("dev").spec
    assert inventory.unmatched_limit_patterns(spec, "rack_00,dev-r01-n0*,!dev-r00-n00") == []
    assert inventory.unmatched_limit_patterns(spec, "rack_09,nope") == ["rack_09", "nope"]
    names = [n.name for n in inventory.limit_nodes(spec, "rack_01:&dev-r01-n0[0-2]:!dev-r01-n01")]
    assert names == ["dev-r01-n00", "dev-r01-n02"]


def test_inventory_plugin_through_ansible_inventory(tmp_path: Path) -> None:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ANSIBLE_DIR / "ansible.cfg")}
    exe = str(Path(sys.executable).parent / "ansible-inventory")
    r = subprocess.run([exe, "-i", "inventory/prod.exaserve.yml", "--list"], cwd=ANSIBLE_DIR, env=env,
                       capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    doc = json.loads(r.stdout)
    hostvars = doc["_meta"]["hostvars"]
    spec = load_stack("prod").spec
    assert len(hostvars) == spec.cluster.node_count == 256
    node = spec.cluster.nodes[17]
    # Strings from the plugin are marked unsafe (never templated); --list shows that wrapper.
    assert hostvars[node.name]["ansible_host"] == {"__ansible_unsafe": str(node.address)}
    assert hostvars[node.name]["exaserve_rack_group"] == {"__ansible_unsafe": inventory.group_name(node.rack)}
    assert hostvars[node.name]["exaserve_gpu_count"] == spec.cluster.gpu.count_per_node  # group var, merged
    assert node.name in doc[inventory.group_name(node.rack)]["hosts"]
    # A broken stack: the error names the file, the field and the fix, and no host is added.
    broken = tmp_path / "Pulumi.broken.yaml"
    broken.write_text(
        "config:\n  exaserve:cluster:\n    pools:\n      - {name: gpu, count: 0, subnet: 10.0.0.0/24, first_address: 10.0.0.1}\n"
    )
    cfg = tmp_path / "broken.exaserve.yml"
    cfg.write_text(f"plugin: exaserve\nstack_file: {broken}\n")
    r = subprocess.run([exe, "-i", str(cfg), "--list"], cwd=ANSIBLE_DIR, env=env, capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert "cluster.pools[0].count" in r.stderr and "greater than 0" in r.stderr
    assert json.loads(r.stdout)["_meta"]["hostvars"] == {}


# ------------------------------------------------------------------------------------------ filters


@pytest.mark.parametrize("path", ["/models", "/mnt/model-store", "/a.b/.c", "/x y/ü", "/"])
def test_mount_unit_name_matches_systemd_escape(path: str) -> None:
    filters = _load_plugin("filter", "exaserve")
    expected = subprocess.run(["systemd-escape", "--path", "--suffix=mount", path], capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip
    assert filters.exaserve_mount_unit(path) == expected


def test_version_max_is_numeric() -> None:
    filters = _load_plugin("filter", "exaserve")
    assert filters.exaserve_version_max(["12.1", "12.10", "12.6", ""]) == "12.10"


# ------------------------------------------------------------------------------------------ modules


def test_container_parsers_on_recorded_output() -> None:
    m = load_module("container_gpu_facts")
    info = m.parse_nvidia_container_cli_info((DATA / "nvidia_container_cli_info_h100x8.txt").read_text())
    assert info["nvrm_version"] == "570.195.03" and info["cuda_version"] == "12.8"
    assert info["device_count"] == 8 and info["devices"][7]["bus_location"] == "00000000:c1:00.0"
    assert info["devices"][0] == {
        "index": 0, "minor": 0, "model": "NVIDIA H100 80GB HBM3", "brand": "Nvidia",
        "uuid": "GPU-6a1e3f52-9c1b-4be0-8f6e-2d4c1a7b0000", "bus_location": "00000000:16:00.0", "architecture": "9.0",
    }  # fmt: skip
    v2 = m.parse_containerd_runtimes((DATA / "containerd_config_dump_nvidia.toml").read_text())
    assert v2 == {
        "runtimes": {"nvidia": "/usr/bin/nvidia-container-runtime", "runc": None},
        "default_runtime": "nvidia",
    }
    assert m.nvidia_runtime(v2["runtimes"]) is True
    v3 = m.parse_containerd_runtimes((DATA / "containerd_config_dump_v3_runc_only.toml").read_text())
    assert v3 == {"runtimes": {"runc": None}, "default_runtime": "runc"}
    assert m.nvidia_runtime(v3["runtimes"]) is False
    assert m.parse_ctr_version((DATA / "ctr_version.txt").read_text()) == {"client": "v1.7.12", "server": "v1.7.12"}
    assert m.parse_ctr_version((DATA / "ctr_version_no_daemon.txt").read_text())["server"] is None
    docker = m.parse_docker_info(json.dumps({"ServerVersion": "27.1.1", "DefaultRuntime": "runc",
                                             "Runtimes": {"nvidia": {"path": "nvidia-container-runtime"}, "runc": {"path": "runc"}}}))  # fmt: skip
    assert docker["server_version"] == "27.1.1" and m.nvidia_runtime(docker["runtimes"])
    with pytest.raises(m.ContainerParseError, match="not 'Label: value'"):
        m.parse_nvidia_container_cli_info("NVRM version:   1\ngarbage line\n")


def test_ping_summary_parser_on_real_ping() -> None:
    m = load_module("peer_ping_facts")
    out = subprocess.run(["ping", "-n", "-q", "-c", "3", "-i", "0.2", "-w", "3", "127.0.0.1"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    s = m.parse_ping_summary(out)
    assert s["transmitted"] == 3 and s["received"] == 3 and s["loss_pct"] == 0.0
    assert 0 < s["rtt_min_ms"] <= s["rtt_avg_ms"] <= s["rtt_max_ms"]
    assert m.describe({**s, "name": "lo", "address": "127.0.0.1"}).startswith("lo (127.0.0.1) 0.0 % loss, rtt avg/max ")
    dead = m.parse_ping_summary(
        "--- 10.9.9.9 ping statistics ---\n2 packets transmitted, 0 received, 100% packet loss, time 1010ms\n"
    )
    assert dead == {"transmitted": 2, "received": 0, "loss_pct": 100.0, "rtt_min_ms": None, "rtt_avg_ms": None,
                    "rtt_max_ms": None}  # fmt: skip


def test_storage_helpers(tmp_path: Path) -> None:
    m = load_module("storage_facts")
    assert m.model_listing([("config.json", 10), ("model-00001.safetensors", 5), ("tokenizer.json", 3)]) == {
        "has_config": True, "weight_files": 1, "weight_bytes": 5,
    }  # fmt: skip
    assert m.nearest_existing(str(tmp_path / "a" / "b")) == str(tmp_path)
    shm = subprocess.run(["findmnt", "--json", "--output", "TARGET,SOURCE,FSTYPE", "--mountpoint", "/dev/shm"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert m.parse_findmnt(shm) == {"mounted": True, "source": "tmpfs", "fstype": "tmpfs"}


def test_fabric_module_reads_the_last_json_line() -> None:
    m = load_module("fabric_allreduce")
    out = 'UserWarning: NumPy\n{"busbw_gbps": 3.1, "backend": "gloo"}\n'
    assert m.parse_worker_output(out) == {"busbw_gbps": 3.1, "backend": "gloo", "error": None}
    assert "printed no result" in m.parse_worker_output("Traceback ...")["error"]


def test_every_module_this_issue_adds_supports_check_mode() -> None:
    for name in ("container_gpu_facts", "storage_facts", "peer_ping_facts", "fabric_allreduce", "os_release_facts"):
        source = (LIBRARY_DIR / f"{name}.py").read_text()
        assert "supports_check_mode=True" in source and "changed=False" in source, name


def test_os_release_parser_on_this_machine_and_quoting() -> None:
    m = load_module("os_release_facts")
    here = m.parse_os_release(Path("/etc/os-release").read_text())
    assert here["id"] and "version_id" in here and here["pretty_name"]
    sample = (
        'NAME="Ubuntu"\nVERSION_ID="22.04"\nPRETTY_NAME="Ubuntu 22.04.4 LTS"\nID=ubuntu\n# comment\nID_LIKE=debian\n'
    )
    assert m.parse_os_release(sample) == {
        "name": "Ubuntu", "version_id": "22.04", "pretty_name": "Ubuntu 22.04.4 LTS", "id": "ubuntu", "id_like": "debian",
    }  # fmt: skip
    with pytest.raises(m.OsReleaseParseError, match="line 1"):
        m.parse_os_release("not a key value line\n")
