"""The parsers of the custom Ansible probe modules, on real tool output (tests/data/probes)
and on the faulty variants the SSH test hosts print."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.hosts import stubs
from tests.support.hosts.collection import ANSIBLE_DIR, MODULES, PROBES, load
from tests.support.hosts.stubs import sample

CONTAINER_DATA = Path(__file__).resolve().parent / "data" / "container"

# The parsers live in module_utils (shared by the single-tool modules and preflight_facts).
ibstat = load("ibstat", "module_utils")
nvidia = load("nvidia_smi", "module_utils")
chrony = load("chrony", "module_utils")
kernel = load("kernel", "module_utils")
container = load("container_gpu", "module_utils")
storage = load("storage", "module_utils")
os_release = load("os_release", "module_utils")
ping = load("peer_ping_facts")
fabric_module = load("fabric_allreduce")
probe = load("probe", "module_utils")

# --- ibstat -------------------------------------------------------------------------------------


def test_ibstat_parses_every_ca_and_port_of_an_h100_node() -> None:
    facts = ibstat.parse_ibstat(sample("ibstat_h100_node.txt"))
    assert facts["ca_count"] == 10
    assert [ca["name"] for ca in facts["cas"]] == [f"mlx5_{i}" for i in range(10)]
    ib = [p for p in facts["ports"] if p["link_layer"] == "InfiniBand"]
    assert len(ib) == 8
    assert {(p["state"], p["physical_state"], p["rate_gbps"]) for p in ib} == {("Active", "LinkUp", 400)}
    assert facts["cas"][0] == {
        "name": "mlx5_0",
        "node_type": "CA",
        "ca_type": "MT4129",
        "number_of_ports": 1,
        "firmware_version": "28.39.1002",
        "hardware_version": "0",
        "node_guid": "0xa088c203005e1000",
        "system_image_guid": "0xa088c203005e1000",
    }
    ethernet = {p["ca"]: p for p in facts["ports"] if p["link_layer"] == "Ethernet"}
    assert ethernet["mlx5_8"]["rate_gbps"] == 100
    assert ethernet["mlx5_9"]["state"] == "Down"


def test_ibstat_parses_the_published_connectx3_sample_exactly() -> None:
    facts = ibstat.parse_ibstat(sample("ibstat_mlx4_kb.txt"))
    assert facts["ports"] == [
        {
            "ca": "mlx4_0",
            "port": 1,
            "state": "Active",
            "physical_state": "LinkUp",
            "rate_gbps": 40,
            "fdr10": False,
            "base_lid": 1,
            "lmc": 0,
            "sm_lid": 1,
            "capability_mask": "0x0251486a",
            "port_guid": "0x0002c9030031fdc1",
            "link_layer": "InfiniBand",
        }
    ]


def test_ibstat_multi_port_adapter_with_fdr10_and_sdr_1x_rates() -> None:
    facts = ibstat.parse_ibstat(sample("ibstat_dual_port.txt"))
    assert facts["cas"][0]["number_of_ports"] == 2
    first, second = facts["ports"]
    assert (first["port"], first["rate_gbps"], first["fdr10"]) == (1, 40, True)
    assert (second["port"], second["rate_gbps"], second["state"]) == (2, 2.5, "Initializing")


def test_ibstat_single_port_form_and_unknown_lines_are_kept() -> None:
    text = "CA: 'mlx5_2'\nPort 1:\nState: Armed\nPhysical state: LinkUp\nRate: 200\nTransport: IB\n"
    facts = ibstat.parse_ibstat(text)
    assert facts["ports"] == [
        {
            "ca": "mlx5_2",
            "port": 1,
            "state": "Armed",
            "physical_state": "LinkUp",
            "rate_gbps": 200,
            "fdr10": False,
            "transport": "IB",
        }
    ]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("\tPort 1:\n\t\tState: Active\n", "before any"),
        ("CA 'mlx5_0'\n\tPort 1:\n\t\tRate: fast\n", "unrecognised Rate"),
        ("CA 'mlx5_0'\n\tgarbage line\n", "not 'Label: value'"),
    ],
)
def test_ibstat_rejects_output_it_does_not_understand(text: str, match: str) -> None:
    with pytest.raises(probe.ProbeParseError, match=match):
        ibstat.parse_ibstat(text)


def test_ibstat_fault_port_down_changes_only_that_adapter() -> None:
    text = stubs.ibstat_with_faults(sample("ibstat_h100_node.txt"), down=("mlx5_3",))
    ports = {p["ca"]: p for p in ibstat.parse_ibstat(text)["ports"]}
    assert (ports["mlx5_3"]["state"], ports["mlx5_3"]["physical_state"]) == ("Down", "Polling")
    assert all(p["state"] == "Active" for ca, p in ports.items() if ca not in ("mlx5_3", "mlx5_9"))


def test_ibstat_fault_lower_rate_changes_infiniband_ports_only() -> None:
    text = stubs.ibstat_with_faults(sample("ibstat_h100_node.txt"), rate_gbps=200)
    ports = ibstat.parse_ibstat(text)["ports"]
    assert {p["rate_gbps"] for p in ports if p["link_layer"] == "InfiniBand"} == {200}
    assert {p["rate_gbps"] for p in ports if p["link_layer"] == "Ethernet"} == {100, 40}


def test_ibstat_stub_without_faults_is_the_sample_byte_for_byte() -> None:
    assert stubs.ibstat_with_faults(sample("ibstat_h100_node.txt")) == sample("ibstat_h100_node.txt")
    with pytest.raises(ValueError, match="no such CA"):
        stubs.ibstat_with_faults(sample("ibstat_h100_node.txt"), down=("mlx5_42",))


# --- nvidia-smi ---------------------------------------------------------------------------------

TABLE = sample("nvidia_smi_query_h100x8.csv")
BANNER = sample("nvidia_smi_h100x8.txt")


def module_query(
    *, gpu_count: int | None = None, memory_used_mib: int | None = None, driver_version: str | None = None
) -> str:
    """What the stub prints for the module's own query (noheader, nounits)."""
    return stubs.nvidia_query(
        TABLE,
        nvidia.QUERY_FIELDS,
        header=False,
        units=False,
        gpu_count=gpu_count,
        memory_used_mib=memory_used_mib,
        driver_version=driver_version,
    )


def test_nvidia_module_query_and_summary_give_the_gpu_inventory() -> None:
    facts = nvidia.build_facts(module_query(), BANNER)
    assert facts["gpu_count"] == 8
    assert (facts["driver_version"], facts["cuda_version"]) == ("570.195.03", "12.8")
    assert facts["gpus"][7] == {
        "index": 7,
        "name": "NVIDIA H100 80GB HBM3",
        "memory_total_mib": 81559,
        "memory_used_mib": 0,
        "driver_version": "570.195.03",
    }


def test_nvidia_csv_with_header_and_units_as_the_source_queries_it() -> None:
    query = stubs.nvidia_query(TABLE, stubs.SOURCE_QUERY_FIELDS, header=True, units=True)
    assert query.splitlines()[0] == "index, name, memory.total [MiB], memory.used [MiB]"
    gpus = nvidia.parse_query_csv(query)
    assert [g["memory_total_mib"] for g in gpus] == [81559] * 8


def test_nvidia_recorded_busy_v100_node() -> None:
    gpus = nvidia.parse_query_csv(sample("nvidia_smi_query_v100x8_busy.csv"))
    busy = [g["index"] for g in gpus if g["utilization_gpu_pct"] > 0]
    assert busy == [6]
    assert gpus[6]["memory_used_mib"] == 13928
    assert gpus[5]["memory_total_mib"] == 32764
    assert gpus[0]["temperature_gpu"] == 35


def test_nvidia_recorded_a100_with_fractional_power() -> None:
    gpus = nvidia.parse_query_csv(sample("nvidia_smi_query_a100x2_power.csv"))
    assert [g["power_draw_w"] for g in gpus] == [68.12, 65.03]
    assert gpus[0]["memory_free_mib"] == 20450


def test_nvidia_not_available_cells_become_none() -> None:
    gpus = nvidia.parse_query_csv("0, NVIDIA GH200 480GB, [N/A], [N/A], 560.35.03\n", nvidia.QUERY_FIELDS)
    assert (gpus[0]["memory_total_mib"], gpus[0]["memory_used_mib"]) == (None, None)


@pytest.mark.parametrize(
    ("query", "match"),
    [
        ("0, NVIDIA H100 80GB HBM3, 81559\n", "has 3 columns, the query has 5"),
        ("0, A, 1, 0, 550.54.15\n1, A, 1, 0, 535.104.05\n", "different driver versions"),
    ],
)
def test_nvidia_rejects_inconsistent_output(query: str, match: str) -> None:
    with pytest.raises(probe.ProbeParseError, match=match):
        nvidia.build_facts(query, BANNER)


def test_nvidia_stub_renders_the_recorded_samples_unchanged() -> None:
    header_form = stubs.nvidia_query(TABLE, nvidia.QUERY_FIELDS, header=True, units=True)
    assert header_form == TABLE
    assert stubs.nvidia_banner(BANNER) == BANNER


def test_nvidia_fault_missing_gpu_old_driver_and_busy_memory() -> None:
    changes = {"gpu_count": 7, "memory_used_mib": 40960}
    banner = stubs.nvidia_banner(BANNER, driver_version="525.147.05", cuda_version="12.0", **changes)
    facts = nvidia.build_facts(module_query(driver_version="525.147.05", **changes), banner)
    assert (facts["gpu_count"], facts["driver_version"], facts["cuda_version"]) == (7, "525.147.05", "12.0")
    assert {g["memory_used_mib"] for g in facts["gpus"]} == {40960}
    assert banner.count("NVIDIA H100 80GB HBM3") == 7
    assert banner.count("  40960MiB /  81559MiB |") == 7
    table_lines = [line for line in banner.splitlines() if line.startswith(("|", "+"))]
    assert {len(line) for line in table_lines} == {91}, "the summary table keeps nvidia-smi's widths"


def test_nvidia_failures_explain_the_fix() -> None:
    """The probe skeleton's message for a failed run, with nvidia-smi's fix chosen by its exit code."""
    no_driver = probe.exit_message(
        ["/usr/bin/nvidia-smi"], 9, sample("nvidia_smi_no_driver.txt"), nvidia.failure_fix(9)
    )
    assert no_driver.startswith("nvidia-smi exited 9: NVIDIA-SMI has failed because it couldn't communicate")
    assert "installed and running. The driver is installed but not working" in no_driver
    no_gpu = probe.exit_message(["/usr/bin/nvidia-smi"], 6, "No devices were found\n", nvidia.failure_fix(6))
    assert no_gpu.startswith("nvidia-smi exited 6: No devices were found. The driver sees no GPU")
    query = probe.exit_message(["/usr/bin/nvidia-smi", *nvidia.QUERY_ARGS], 6, "", nvidia.failure_fix(6))
    assert query.startswith("nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=")


# --- chronyc ------------------------------------------------------------------------------------


def test_chrony_manpage_sample_text_and_csv_agree() -> None:
    text = chrony.parse_tracking_text(sample("chronyc_tracking_manpage.txt"))
    csv = chrony.parse_tracking_csv(sample("chronyc_tracking_manpage.csv"))
    assert text == csv
    assert text["system_time_offset_s"] == pytest.approx(-0.000006523)
    assert text["frequency_ppm"] == pytest.approx(-3.225)
    assert (text["reference_id"], text["reference_name"], text["stratum"]) == ("CB00710F", "foo.example.net", 3)
    assert text["ref_time_epoch_s"] == 1485510557.0
    assert text["synchronised"] is True


@pytest.mark.parametrize(("name", "offset"), [("slow", -1.781535149), ("fast", 3.316339493)])
def test_chrony_live_captures_give_the_sign_chronyc_means(name: str, offset: float) -> None:
    """Captured from a real chronyd 4.3 (`-x`, clock untouched) after `settime` moved its idea of
    NTP time: "slow" is behind (negative), "fast" ahead, and the CSV field is the opposite sign."""
    text = chrony.parse_tracking_text(sample(f"chronyc_tracking_{name}.txt"))
    csv = chrony.parse_tracking_csv(sample(f"chronyc_tracking_{name}.csv"))
    assert text["system_time_offset_s"] == pytest.approx(offset)
    # The text and CSV captures were taken one after the other; the offset drifted a little.
    assert csv["system_time_offset_s"] == pytest.approx(offset, abs=0.005)
    assert csv["reference_name"] == text["reference_name"] == ""


def test_chrony_unsynchronised_daemon() -> None:
    for facts in (
        chrony.parse_tracking_text(sample("chronyc_tracking_unsynchronised.txt")),
        chrony.parse_tracking_csv(sample("chronyc_tracking_unsynchronised.csv")),
    ):
        assert (facts["synchronised"], facts["leap_status"], facts["stratum"]) == (False, "Not synchronised", 0)


@pytest.mark.parametrize("offset", [0.25, -0.25, 0.0])
def test_chrony_fault_offset_round_trips_through_both_formats(offset: float) -> None:
    text = stubs.chronyc_text_with_offset(sample("chronyc_tracking_manpage.txt"), offset)
    csv = stubs.chronyc_csv_with_offset(sample("chronyc_tracking_manpage.csv"), offset)
    word = "slow" if offset < 0 else "fast"
    assert f"System time     : {abs(offset):.9f} seconds {word} of NTP time\n" in text
    assert chrony.parse_tracking_text(text)["system_time_offset_s"] == offset
    assert chrony.parse_tracking_csv(csv)["system_time_offset_s"] == offset


@pytest.mark.parametrize(
    ("parser", "text", "match"),
    [
        ("parse_tracking_csv", sample("chronyc_no_daemon.txt"), "expected 14 CSV fields"),
        ("parse_tracking_text", sample("chronyc_no_daemon.txt"), "lacks reference_id"),
        ("parse_tracking_csv", "7F7F0101,,x,0,0,0,0,0,0,0,0,0,0,Normal\n", "non-numeric"),
        ("parse_tracking_text", "System time     : 0.1 seconds sideways of NTP time\n", "unrecognised value"),
    ],
)
def test_chrony_rejects_what_is_not_a_tracking_report(parser: str, text: str, match: str) -> None:
    with pytest.raises(probe.ProbeParseError, match=match):
        getattr(chrony, parser)(text)


# --- kernel and cgroup --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("release", "version"),
    [("5.15.0-91-generic", "5.15.0"), ("2.6.78-fc-v769", "2.6.78"), ("6.8", "6.8.0"), ("6.1.0-28-amd64", "6.1.0")],
)
def test_kernel_version_from_release(release: str, version: str) -> None:
    assert kernel.kernel_version(release) == version


def test_kernel_version_rejects_a_release_without_numbers() -> None:
    with pytest.raises(probe.ProbeParseError, match="does not start with"):
        kernel.kernel_version("generic")


@pytest.mark.parametrize(
    ("name", "controllers_text", "expected"),
    [
        (
            "mountinfo_unified_ubuntu.txt",
            "cpuset cpu io memory hugetlb pids rdma misc\n",
            {
                "version": 2,
                "mode": "unified",
                "fstype": "cgroup2",
                "unified_mountpoint": "/sys/fs/cgroup",
                "controllers": ["cpu", "cpuset", "hugetlb", "io", "memory", "misc", "pids", "rdma"],
            },
        ),
        (
            "mountinfo_hybrid_vm.txt",
            None,
            {
                "version": 1,
                "mode": "hybrid",
                "fstype": "tmpfs",
                "unified_mountpoint": "/sys/fs/cgroup/unified",
                "controllers": ["blkio", "cpu", "cpuacct", "cpuset", "devices", "freezer", "memory", "pids"],
            },
        ),
        (
            "mountinfo_legacy_vm.txt",
            None,
            {
                "version": 1,
                "mode": "legacy",
                "fstype": "tmpfs",
                "unified_mountpoint": None,
                "controllers": ["blkio", "cpu", "cpuacct", "cpuset", "devices", "freezer", "memory", "pids"],
            },
        ),
    ],
)
def test_cgroup_layout_of_recorded_mount_tables(
    name: str, controllers_text: str | None, expected: dict[str, Any]
) -> None:
    assert kernel.cgroup_layout(kernel.parse_mountinfo(sample(name)), controllers_text) == expected


def test_mountinfo_escapes_and_nothing_mounted() -> None:
    mounts = kernel.parse_mountinfo(sample("mountinfo_unified_ubuntu.txt"))
    assert "/mnt/My Disk" in {m["mountpoint"] for m in mounts}
    bare = [m for m in mounts if m["mountpoint"] != "/sys/fs/cgroup"]
    assert kernel.cgroup_layout(bare, None)["mode"] == "none"
    with pytest.raises(probe.ProbeParseError, match="unrecognised mountinfo line"):
        kernel.parse_mountinfo("31 23 0:27 / /sys/fs/cgroup rw\n")


def test_cgroup_facts_of_this_machine_match_stat() -> None:
    """The module's reading of /sys/fs/cgroup agrees with `stat -fc %T`, the classic check."""
    fstype = subprocess.run(["stat", "-fc", "%T", "/sys/fs/cgroup"], capture_output=True, text=True, check=True)
    facts = kernel.read_cgroup_facts()
    assert (facts["version"] == 2) == (fstype.stdout.strip() == "cgroup2fs")


# --- container runtime, ping, storage, all-reduce worker output, os-release ----------------------


def test_container_parsers_on_recorded_output() -> None:
    m = container
    info = m.parse_nvidia_container_cli_info((CONTAINER_DATA / "nvidia_container_cli_info_h100x8.txt").read_text())
    assert info["nvrm_version"] == "570.195.03" and info["cuda_version"] == "12.8"
    assert info["device_count"] == 8 and info["devices"][7]["bus_location"] == "00000000:c1:00.0"
    assert info["devices"][0] == {
        "index": 0, "minor": 0, "model": "NVIDIA H100 80GB HBM3", "brand": "Nvidia",
        "uuid": "GPU-6a1e3f52-9c1b-4be0-8f6e-2d4c1a7b0000", "bus_location": "00000000:16:00.0", "architecture": "9.0",
    }  # fmt: skip
    v2 = m.parse_containerd_runtimes((CONTAINER_DATA / "containerd_config_dump_nvidia.toml").read_text())
    assert v2 == {
        "runtimes": {"nvidia": "/usr/bin/nvidia-container-runtime", "runc": None},
        "default_runtime": "nvidia",
    }
    assert m.nvidia_runtime(v2["runtimes"]) is True
    v3 = m.parse_containerd_runtimes((CONTAINER_DATA / "containerd_config_dump_v3_runc_only.toml").read_text())
    assert v3 == {"runtimes": {"runc": None}, "default_runtime": "runc"}
    assert m.nvidia_runtime(v3["runtimes"]) is False
    assert m.parse_ctr_version((CONTAINER_DATA / "ctr_version.txt").read_text()) == {
        "client": "v1.7.12",
        "server": "v1.7.12",
    }
    assert m.parse_ctr_version((CONTAINER_DATA / "ctr_version_no_daemon.txt").read_text())["server"] is None
    docker = m.parse_docker_info(json.dumps({"ServerVersion": "27.1.1", "DefaultRuntime": "runc",
                                             "Runtimes": {"nvidia": {"path": "nvidia-container-runtime"}, "runc": {"path": "runc"}}}))  # fmt: skip
    assert docker["server_version"] == "27.1.1" and m.nvidia_runtime(docker["runtimes"])
    with pytest.raises(probe.ProbeParseError, match="not 'Label: value'"):
        m.parse_nvidia_container_cli_info("NVRM version:   1\ngarbage line\n")


def test_ping_summary_parser_on_real_ping() -> None:
    m = ping
    out = subprocess.run(["ping", "-n", "-q", "-c", "3", "-i", "0.2", "-w", "3", "127.0.0.1"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    s = m.parse_ping_summary(out)
    assert s["transmitted"] == 3 and s["received"] == 3 and s["loss_pct"] == 0.0
    assert 0 < s["rtt_min_ms"] <= s["rtt_avg_ms"] <= s["rtt_max_ms"]  # not a timing judgment: parsed min ≤ avg ≤ max
    assert m.describe({**s, "name": "lo", "address": "127.0.0.1"}).startswith("lo (127.0.0.1) 0.0 % loss, rtt avg/max ")
    dead = m.parse_ping_summary(
        "--- 10.9.9.9 ping statistics ---\n2 packets transmitted, 0 received, 100% packet loss, time 1010ms\n"
    )
    assert dead == {"transmitted": 2, "received": 0, "loss_pct": 100.0, "rtt_min_ms": None, "rtt_avg_ms": None,
                    "rtt_max_ms": None}  # fmt: skip


def test_storage_helpers(tmp_path: Path) -> None:
    m = storage
    assert m.model_listing([("config.json", 10), ("model-00001.safetensors", 5), ("tokenizer.json", 3)]) == {
        "has_config": True, "weight_files": 1, "weight_bytes": 5,
    }  # fmt: skip
    assert m.nearest_existing(str(tmp_path / "a" / "b")) == str(tmp_path)
    index = '{"metadata": {"total_size": 12}, "weight_map": {"a": "s-1.safetensors", "b": "s-2.safetensors"}}'
    assert m.checkpoint_index(index, {"s-1.safetensors", "config.json"}) == {
        "index_total_size": 12, "index_shards": 2, "index_shards_missing": ["s-2.safetensors"],
    }  # fmt: skip
    shm = subprocess.run(["findmnt", "--json", "--output", "TARGET,SOURCE,FSTYPE", "--mountpoint", "/dev/shm"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert m.parse_findmnt(shm) == {"mounted": True, "source": "tmpfs", "fstype": "tmpfs"}


def test_fabric_module_reads_the_last_json_line() -> None:
    m = fabric_module
    out = 'UserWarning: NumPy\n{"busbw_gbps": 3.1, "backend": "gloo"}\n'
    assert m.parse_worker_output(out) == {"busbw_gbps": 3.1, "backend": "gloo", "error": None}
    assert "printed no result" in m.parse_worker_output("Traceback ...")["error"]


def test_os_release_parser_on_this_machine_and_quoting() -> None:
    m = os_release
    here = m.parse_os_release(Path("/etc/os-release").read_text())
    assert here["id"] and "version_id" in here and here["pretty_name"]
    sample = (
        'NAME="Ubuntu"\nVERSION_ID="22.04"\nPRETTY_NAME="Ubuntu 22.04.4 LTS"\nID=ubuntu\n# comment\nID_LIKE=debian\n'
    )
    assert m.parse_os_release(sample) == {
        "name": "Ubuntu", "version_id": "22.04", "pretty_name": "Ubuntu 22.04.4 LTS", "id": "ubuntu", "id_like": "debian",
    }  # fmt: skip
    with pytest.raises(probe.ProbeParseError, match="line 1"):
        m.parse_os_release("not a key value line\n")


# --- module metadata ----------------------------------------------------------------------------


def test_every_module_documents_itself_for_ansible_doc() -> None:
    """`ansible-doc` finds every module of the collection by FQCN (through ansible.cfg's collections_path),
    parses DOCUMENTATION/EXAMPLES/RETURN with the read-only doc fragment merged in, and the documented
    options match the ARGUMENT_SPEC each probe passes to the probe skeleton."""
    venv_bin = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{venv_bin}:{os.environ['PATH']}", "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_CONFIG": str(ANSIBLE_DIR / "ansible.cfg")}  # fmt: skip
    fqcns = [f"exaserve.fleet.{name}" for name in MODULES]
    result = subprocess.run(
        [str(venv_bin / "ansible-doc"), "-j", *fqcns], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 0, result.stderr
    docs = json.loads(result.stdout)
    assert set(docs) == set(fqcns)
    for fqcn, doc in docs.items():
        name = fqcn.rsplit(".", 1)[1]
        assert doc["doc"]["module"] == name
        assert doc["examples"].strip() and doc["return"], name
        assert doc["doc"]["attributes"]["check_mode"]["support"] == "full", name  # from exaserve.fleet.read_only
        assert any("never changes the node" in note for note in doc["doc"]["notes"]), name
        if name not in PROBES:
            continue
        options = doc["doc"].get("options") or {}
        spec = load(name).ARGUMENT_SPEC
        assert set(options) == set(spec), name
        for option, rules in spec.items():
            documented = {key: options[option].get(key) for key in rules}
            assert documented == rules, f"{name}.{option}: documented {documented}, argument_spec {rules}"


# --- one-round-trip probe (preflight_facts) -----------------------------------------------------

preflight_facts = load("preflight_facts")


def test_ibstat_fault_one_slow_port_changes_that_port_only() -> None:
    text = stubs.ibstat_with_faults(sample("ibstat_h100_node.txt"), port_rates=[("mlx5_2", 1, 200)])
    rates = {(p["ca"], p["port"]): p["rate_gbps"] for p in ibstat.parse_ibstat(text)["ports"]}
    assert rates.pop(("mlx5_2", 1)) == 200
    assert {rate for (ca, _), rate in rates.items() if ca.startswith("mlx5_") and ca not in ("mlx5_8", "mlx5_9")} == {
        400
    }
    with pytest.raises(ValueError, match="no such CA port"):
        stubs.ibstat_with_faults(sample("ibstat_h100_node.txt"), port_rates=[("mlx5_2", 2, 200)])


def test_preflight_facts_sections_follow_the_tags_asked_for() -> None:
    params = {"sections": ["gpu", "ntp"], "container_runtime": "containerd", "mount_path": None,
              "model_dir": None, "cache_path": None}  # fmt: skip
    assert list(preflight_facts.readers(params)) == ["gpu", "ntp"]
    assert preflight_facts.readers(params)["gpu"] is nvidia.read_nvidia_smi
    every = preflight_facts.readers({**params, "sections": list(preflight_facts.SECTIONS)})
    assert list(every) == ["os", "gpu", "rdma", "container", "ntp", "storage"]


def test_preflight_facts_keeps_every_sections_facts_and_each_failure_apart() -> None:
    """Sections run at once: a failing one and a hung one do not hide the facts of the others, and the
    hung one costs the deadline once (its thread is abandoned, not waited for)."""

    def hangs(_probe: Any) -> dict[str, Any]:
        time.sleep(30)
        return {}

    def fails(_probe: Any) -> dict[str, Any]:
        raise probe.ProbeFailure("chronyc tracking exited 1: 506 Cannot talk to daemon. Start chronyd")

    readers = {"os": lambda _p: {"host_kernel": {"release": "6.1.0"}}, "ntp": fails, "gpu": hangs}
    got = preflight_facts.read_sections(object(), readers, deadline_s=0.5)
    assert got["host_kernel"] == {"release": "6.1.0"}
    assert got["preflight_probe_errors"]["ntp"].startswith("chronyc tracking exited 1")
    assert "did not finish within 0.5 s" in got["preflight_probe_errors"]["gpu"]
    assert set(got["preflight_probe_errors"]) == {"ntp", "gpu"}
    assert set(got["preflight_probe_seconds"]) == {"os", "ntp"}
