"""The exaserve.fleet collection (ansible/collections/ansible_collections/exaserve/fleet): its layout
rules (roles and playbooks inside it and called by FQCN, ansible/*.yml only importing its playbooks, one
probe skeleton, one read-only doc fragment, FQCN everywhere, the controller dependency kept to three
plugins), its modules run through Ansible, and the controller-side logic its plugins call
(the preflight report, fabric arithmetic, inventory variables, filters). The probe modules' parsers
are tested in tests/test_probe_parsers.py."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from serving.checks.preflight import CHECKS, ReportError, build_report, check_result, load_report, summary_lines
from serving.node import fabric
from serving.render import inventory
from serving.spec.stack import load_stack
from tests.support.ci import unavailable
from tests.support.hosts.collection import (
    ANSIBLE_DIR,
    COLLECTION_DIR,
    COLLECTIONS_DIR,
    PLAYBOOKS_DIR,
    PROBES,
    ROLES_DIR,
    load,
)

VENV_BIN = Path(sys.executable).parent
PLUGINS_DIR = COLLECTION_DIR / "plugins"
PROBE_IMPORT = "ansible_collections.exaserve.fleet.plugins.module_utils.probe"


def _ansible_env() -> dict[str, str]:
    return {**os.environ, "ANSIBLE_CONFIG": str(ANSIBLE_DIR / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}


# ------------------------------------------------------------------------------------------ collection layout


def _imports(path: Path) -> set[str]:
    """Every module name ``path`` imports (``import a.b`` and ``from a.b import c`` give ``a.b``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def _calls(path: Path) -> set[str]:
    """Names of the functions and methods ``path`` calls (``module.get_bin_path(...)`` gives ``get_bin_path``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            found.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return found


# Probes that start processes themselves, and why (the skeleton's run() fails the module on a timeout or a missing tool).
OWN_PROCESSES = {
    "fabric_allreduce": "the all-reduce worker, killed after timeout_s plus interpreter start-up",
}


@pytest.mark.parametrize("name", PROBES)
def test_every_probe_is_built_on_the_one_skeleton(name: str) -> None:
    """The find-binary / run / parse / fail skeleton exists once, in module_utils/probe.py: every probe
    imports it and none builds its own AnsibleModule, looks up binaries or runs commands itself."""
    path = PLUGINS_DIR / "modules" / f"{name}.py"
    imports, calls = _imports(path), _calls(path)
    assert PROBE_IMPORT in imports, f"{name} does not import {PROBE_IMPORT}"
    assert "Probe" in calls, f"{name} does not run through Probe"
    assert not {"ansible.module_utils.basic"} & imports, f"{name} imports AnsibleModule itself"
    assert not {"AnsibleModule", "get_bin_path", "run_command", "fail_json", "exit_json"} & calls, name
    if name not in OWN_PROCESSES:
        assert "subprocess" not in imports, f"{name} runs commands without the skeleton"
    source = path.read_text()
    assert "extends_documentation_fragment: [exaserve.fleet.read_only]" in source, name
    assert "never changes the node" not in source, f"{name} repeats the read-only text of the doc fragment"


def test_the_skeleton_lives_in_module_utils_only() -> None:
    """Only probe.py touches AnsibleModule's binary lookup and command runner."""
    users = {
        path.relative_to(PLUGINS_DIR).as_posix()
        for path in PLUGINS_DIR.rglob("*.py")
        if {"get_bin_path", "run_command"} & _calls(path)
    }
    assert users == {"module_utils/probe.py"}


def test_only_three_controller_plugins_reach_serving_and_only_through_the_bridge() -> None:
    """Modules run on the nodes and never import the controller package; the plugins that need its logic
    name it through plugin_utils/controller.py (which documents why each does)."""
    bridge = PLUGINS_DIR / "plugin_utils" / "controller.py"
    bridge_import = "ansible_collections.exaserve.fleet.plugins.plugin_utils.controller"
    users = set()
    for path in PLUGINS_DIR.rglob("*.py"):
        assert not any(name.split(".")[0] == "serving" for name in _imports(path)), f"{path} imports serving directly"
        if bridge_import in _imports(path):
            users.add(path.relative_to(PLUGINS_DIR).as_posix())
    assert users == {"action/preflight_record.py", "filter/fleet.py", "inventory/exaserve.py"}
    documented = bridge.read_text()
    for plugin in ("inventory/exaserve", "filter/fleet", "action/preflight_record"):
        assert f"``{plugin}``" in documented, plugin


def test_the_bridge_names_the_missing_package_and_the_fix() -> None:
    from ansible.errors import AnsibleError

    controller = load("controller", "plugin_utils").controller
    assert controller("serving.checks.preflight", "x").check_result is check_result
    with pytest.raises(AnsibleError, match=r"filter exaserve.fleet.x needs serving.nope from the exaserve-deploy package.*"
                       r"Run ansible-playbook from the project's virtualenv"):  # fmt: skip
        controller("serving.nope", "filter exaserve.fleet.x")


def _tasks(node: Any) -> Iterator[dict[str, Any]]:
    """Every task (and handler) in a parsed tasks file or playbook, blocks included."""
    if isinstance(node, list):
        for item in node:
            yield from _tasks(item)
    elif isinstance(node, dict):
        if "name" in node and not {"hosts", "import_playbook"} & set(node) and not {"block"} & set(node):
            yield node
        for key in ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always"):
            yield from _tasks(node.get(key))


TASK_KEYWORDS = {
    "name", "when", "register", "vars", "loop", "loop_control", "tags", "notify", "changed_when", "failed_when",
    "timeout", "ignore_unreachable", "run_once", "delegate_to", "check_mode", "become", "no_log", "listen",
    "environment", "until", "retries", "delay",
}  # fmt: skip


def test_every_task_calls_its_module_by_fully_qualified_name() -> None:
    """Roles and playbooks call ansible.builtin.* and exaserve.fleet.* by FQCN (ansible-lint's fqcn rule
    enforces it too; this test reads the files directly)."""
    files = [*ANSIBLE_DIR.glob("*.yml"), *PLAYBOOKS_DIR.glob("*.yml"), *ROLES_DIR.glob("*/tasks/*.yml"),
             *ROLES_DIR.glob("*/handlers/*.yml")]  # fmt: skip
    seen: set[str] = set()
    for path in files:
        for task in _tasks(yaml.safe_load(path.read_text())):
            actions = set(task) - TASK_KEYWORDS
            assert len(actions) == 1, f"{path}: task {task['name']!r} has actions {sorted(actions)}"
            action = actions.pop()
            assert action.startswith(("ansible.builtin.", "exaserve.fleet.")), f"{path}: {task['name']!r} uses {action}"
            seen.add(action)
    # A single-tool module (for `ansible NODE -m exaserve.fleet.nvidia_smi_facts` on one node) is in use when
    # its reader is one preflight_facts runs; any other module must be called by a role.
    readers = {m for m in _imports(PLUGINS_DIR / "modules" / "preflight_facts.py") if ".module_utils." in m}
    single_tool = {
        name for name in PROBES if _imports(PLUGINS_DIR / "modules" / f"{name}.py") & readers - {PROBE_IMPORT}
    }
    assert len(single_tool) >= 6, single_tool
    unused = {f"exaserve.fleet.{name}" for name in (*PROBES, "preflight_record") if name not in single_tool} - seen
    assert not unused, f"modules no role calls: {sorted(unused)}"


def test_ansible_lint_enforces_fqcn_and_skips_nothing() -> None:
    config = yaml.safe_load((ANSIBLE_DIR / ".ansible-lint").read_text())
    assert config["profile"] == "production"  # includes the fqcn rule
    for key in ("skip_list", "warn_list", "enable_list"):
        assert not config.get(key), f".ansible-lint {key}: {config.get(key)} (house style: local noqa only)"


def test_ansible_cfg_points_at_the_collection() -> None:
    cfg = (ANSIBLE_DIR / "ansible.cfg").read_text()
    assert "collections_path = collections" in cfg
    assert "roles_path" not in cfg, "every role is the collection's, found by its FQCN"
    assert (ANSIBLE_DIR / "collections") == COLLECTIONS_DIR
    galaxy = yaml.safe_load((COLLECTION_DIR / "galaxy.yml").read_text())
    assert (galaxy["namespace"], galaxy["name"]) == ("exaserve", "fleet")
    for inventory_file in (ANSIBLE_DIR / "inventory").glob("*.exaserve.yml"):
        assert yaml.safe_load(inventory_file.read_text())["plugin"] == "exaserve.fleet.exaserve", inventory_file


# Provisioning role -> the preflight role that checks what it set up.
ROLE_PAIRS = {
    "os": "preflight_os",
    "gpu": "preflight_gpu",
    "rdma": "preflight_rdma",
    "container": "preflight_container",
    "ntp": "preflight_ntp",
    "storage": "preflight_storage",
    "connectivity": "preflight_connectivity",
}


def test_the_entry_points_only_import_the_collection_playbooks() -> None:
    """ansible/preflight.yml and ansible/site.yml stay the user's entry points, and hold nothing but the
    import of the collection's playbook of the same name; no role or playbook lives outside the collection."""
    entry_points = sorted(path.name for path in ANSIBLE_DIR.glob("*.yml"))
    assert entry_points == sorted(path.name for path in PLAYBOOKS_DIR.glob("*.yml")) == ["preflight.yml", "site.yml"]
    for name in entry_points:
        plays = yaml.safe_load((ANSIBLE_DIR / name).read_text())
        imports = [{k: v for k, v in play.items() if k != "name"} for play in plays]
        assert imports == [{"ansible.builtin.import_playbook": f"exaserve.fleet.{name.removesuffix('.yml')}"}], name
    assert not (ANSIBLE_DIR / "roles").exists()


def _playbook_roles(playbook: str) -> dict[str, set[str]]:
    """Role short name -> tags, for every role the collection's ``playbook`` runs (each called by its FQCN)."""
    roles = {}
    for play in yaml.safe_load((PLAYBOOKS_DIR / playbook).read_text()):
        for entry in play.get("roles", []):
            assert entry["role"].startswith("exaserve.fleet."), f"{playbook}: role {entry['role']} is not an FQCN"
            role = entry["role"].removeprefix("exaserve.fleet.")
            assert (ROLES_DIR / role / "tasks" / "main.yml").is_file(), f"{playbook}: no role {role} in {ROLES_DIR}"
            roles[role] = set(entry.get("tags") or [])
    return roles


def test_every_role_is_run_by_a_playbook_by_its_fqcn() -> None:
    run = set(_playbook_roles("site.yml")) | set(_playbook_roles("preflight.yml"))
    assert run == {path.name for path in ROLES_DIR.iterdir()}


def test_provisioning_and_preflight_roles_pair_by_name_and_tag() -> None:
    """Each provisioning role in site.yml has the preflight role of the same concern in preflight.yml,
    named preflight_<role>, with a shared tag (so --tags ntp provisions or checks the same thing)."""
    site, preflight = _playbook_roles("site.yml"), _playbook_roles("preflight.yml")
    for role, check in ROLE_PAIRS.items():
        assert role in site and check in preflight, (role, check)
        assert check == f"preflight_{role}"
        assert site[role] & preflight[check], f"{role} and {check} share no tag"
    # The rest has no counterpart on purpose: repositories and the toolkit are not checked; the kubelet's
    # registration taint is observed by the cluster (the policy pack's node checks), not by preflight; ssh,
    # fabric and report are checks of their own; preflight_system checks the system pool, which site.yml does
    # not provision (its nodes are the cluster's own).
    assert set(site) - set(ROLE_PAIRS) == {"nvidia_repo", "cuda_toolkit", "kubelet"}
    assert set(preflight) - set(ROLE_PAIRS.values()) == {
        "preflight_ssh",
        "preflight_fabric",
        "preflight_report",
        "preflight_system",
    }


def test_role_variables_carry_their_role_prefix() -> None:
    for role_dir in sorted(ROLES_DIR.iterdir()):
        defaults = yaml.safe_load((role_dir / "defaults" / "main.yml").read_text()) or {}
        specs = yaml.safe_load((role_dir / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]
        for name in [*defaults, *(specs.get("options") or {})]:
            assert name.startswith(role_dir.name + "_"), f"{role_dir.name}: variable {name}"


# ------------------------------------------------------------------------------------------ modules through Ansible


def _adhoc(module: str, args: str, path_first: Path | None = None) -> dict[str, Any]:
    """``ansible localhost -c local -m <FQCN>``: the module packed with its module_utils as Ansible ships it
    (with ``path_first`` first on the module's PATH, for stub tools)."""
    env = _ansible_env()
    if path_first is not None:
        env["PATH"] = f"{path_first}{os.pathsep}{env['PATH']}"
    r = subprocess.run(
        [str(VENV_BIN / "ansible"), "localhost", "-c", "local", "-i", "localhost,", "--check", "-o",
         "-e", f"ansible_python_interpreter={sys.executable}", "-m", f"exaserve.fleet.{module}", "-a", args],
        cwd=ANSIBLE_DIR, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    line = next(line for line in r.stdout.splitlines() if line.startswith("localhost |"))
    status, payload = line.split(" => ", 1)
    return {**json.loads(payload), "status": status.split("|")[1].strip()}


def test_a_probe_runs_through_ansible_with_its_module_utils(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "m" / "model-00001-of-00002.safetensors").write_bytes(b"\0" * 8)
    index = {
        "metadata": {"total_size": 99},
        "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"},
    }
    (tmp_path / "m" / "model.safetensors.index.json").write_text(json.dumps(index))
    result = _adhoc("storage_facts", f"mount_path=/dev/shm model_dir={tmp_path}/m cache_path={tmp_path}/cache")
    assert result["status"] == "SUCCESS" and result["changed"] is False, result
    facts = result["ansible_facts"]["model_storage"]
    assert (facts["mounted"], facts["fstype"], facts["has_config"], facts["free_path"]) == (
        True,
        "tmpfs",
        True,
        str(tmp_path),
    )
    # The store's safetensors index is recorded: its total and the shards it names that the store lacks.
    assert (facts["index_total_size"], facts["index_shards"], facts["index_shards_missing"]) == (
        99,
        2,
        ["model-00002-of-00002.safetensors"],
    )


# A ping that answers for 10.0.0.1 in iputils' format and hangs for anything else, past its -w deadline
# (as a ping stuck in the kernel would); each start is logged, to see the pings start at once.
STUB_PING = """#!/bin/sh
addr=$(eval echo \\${$#})
echo "$addr $(date +%s.%N)" >> "$(dirname "$0")/starts"
if [ "$addr" = 10.0.0.1 ]; then
  printf '%s\\n' "--- $addr ping statistics ---" "5 packets transmitted, 5 received, 0% packet loss, time 804ms" \\
    "rtt min/avg/max/mdev = 0.041/0.052/0.071/0.010 ms"
  exit 0
fi
exec sleep 60
"""


def test_peer_pings_run_at_once_and_a_hung_one_is_killed_past_its_deadline(tmp_path: Path) -> None:
    """peer_ping_facts starts every ping through the probe skeleton's run_all: both hung pings start
    together, are killed deadline + 2 s later and are reported unreachable, next to the one that answered."""
    (tmp_path / "ping").write_text(STUB_PING)
    (tmp_path / "ping").chmod(0o755)
    targets = [{"name": "up", "address": "10.0.0.1"}, {"name": "hung1", "address": "10.0.0.2"},
               {"name": "hung2", "address": "10.0.0.3"}]  # fmt: skip
    result = _adhoc("peer_ping_facts", json.dumps({"targets": targets, "deadline_s": 1}), path_first=tmp_path)
    assert result["status"] == "SUCCESS", result
    up, *hung = result["ansible_facts"]["peer_ping"]
    assert (up["name"], up["received"], up["rtt_avg_ms"], up["reachable"], up["error"]) == ("up", 5, 0.052, True, None)
    for entry in hung:
        assert (entry["reachable"], entry["loss_pct"], entry["error"]) == (False, 100.0, "(killed after 3 s)"), entry
    starts = {line.split()[0]: float(line.split()[1]) for line in (tmp_path / "starts").read_text().splitlines()}
    assert set(starts) == {"10.0.0.1", "10.0.0.2", "10.0.0.3"}
    assert max(starts.values()) - min(starts.values()) < 2, f"the pings did not start at once: {starts}"


def test_a_missing_tool_fails_with_the_skeletons_message_and_the_probes_fix() -> None:
    if any(
        (Path(d) / "ibstat").exists() for d in (*os.environ["PATH"].split(":"), "/sbin", "/usr/sbin", "/usr/local/sbin")
    ):
        # the module also looks in /sbin, /usr/sbin and /usr/local/sbin, which no PATH given to it can hide: a skip
        # here, a failure under CI=true (nothing is skipped there), where the machine must not carry infiniband-diags
        unavailable("ibstat is installed on this machine, so its absence cannot be tested here")
    result = _adhoc("ibstat_facts", "")
    assert result["status"] == "FAILED!", result
    assert result["msg"] == (
        "ibstat is not installed on this node (not found on PATH or in /sbin, /usr/sbin, /usr/local/sbin). "
        "Install the RDMA userspace tools: 'apt-get install infiniband-diags' (or rdma-core / MLNX_OFED), then re-run."
    )


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
    # below 25 Gb/s the measured and the link's rate share a band: the fix does not name one "instead of" itself
    # (the test hosts' 1 Gb/s link said "puts 1 Gb/s at X instead of X")
    starved = fabric.assess(0.78, 1.0)
    assert not starved.passed and starved.fix is not None
    assert "source's table" not in starved.fix and starved.fix.startswith("Check every port of the group with ibstat")


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
        # issue 25: a production stack pins the tag by digest; the digest's hex was read as the tag
        ("lmsysorg/sglang:v0.5.23-cu126@sha256:" + "c0" * 32, "12.6"),
    ],
)
def test_image_cuda(image: str, cuda: str | None) -> None:
    assert inventory.image_cuda(image) == cuda


def test_limit_patterns() -> None:
    spec = load_stack("dev").spec
    assert inventory.unmatched_limit_patterns(spec, "rack_00,dev-r01-n0*,!dev-r00-n00") == []
    assert inventory.unmatched_limit_patterns(spec, "rack_09,nope") == ["rack_09", "nope"]
    # the system pool's group and nodes are patterns too (issue 25); without a limit, only the GPU nodes
    assert inventory.unmatched_limit_patterns(spec, "exaserve_system,dev-system-1") == []
    assert [n.name for n in inventory.limit_nodes(spec, "exaserve_system")] == ["dev-system-0", "dev-system-1"]
    assert len(inventory.limit_nodes(spec, None)) == 16
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
    assert len(hostvars) == spec.cluster.node_count + len(spec.cluster.system_nodes) == 256 + 3
    # Issue 25, finding 6: the system pool's nodes in a group of their own, outside the GPU nodes' `exaserve`.
    system = [n.name for n in spec.cluster.system_nodes]
    assert doc[inventory.SYSTEM_GROUP]["hosts"] == system
    assert not set(system) & set(doc[inventory.FLEET_GROUP].get("hosts", []))
    pool = {"name": {"__ansible_unsafe": "system"}, "cpu": 14.0, "memory_gb": 56.0}
    assert hostvars[system[0]]["exaserve_system_pool"] == pool
    node = spec.cluster.nodes[17]
    # Strings from the plugin are marked unsafe (never templated); --list shows that wrapper.
    assert hostvars[node.name]["ansible_host"] == {"__ansible_unsafe": str(node.address)}
    assert hostvars[node.name]["exaserve_rack_group"] == {"__ansible_unsafe": inventory.group_name(node.rack)}
    assert hostvars[node.name]["exaserve_gpu_count"] == spec.cluster.gpu.count_per_node  # group var, merged
    assert node.name in doc[inventory.group_name(node.rack)]["hosts"]
    # A broken stack: the error names the file, the field and the fix, and the command fails with no inventory (issue
    # 42, ansible.cfg's any_unparsed_is_failed; before: a warning, an empty inventory and exit 0, so a playbook ran its
    # plays on no host and passed).
    broken = tmp_path / "Pulumi.broken.yaml"
    broken.write_text(
        "config:\n  exaserve:cluster:\n    pools:\n      - {name: gpu, count: 0, subnet: 10.0.0.0/24, first_address: 10.0.0.1}\n"
    )
    cfg = tmp_path / "broken.exaserve.yml"
    cfg.write_text(f"plugin: exaserve.fleet.exaserve\nstack_file: {broken}\n")
    r = subprocess.run([exe, "-i", str(cfg), "--list"], cwd=ANSIBLE_DIR, env=env, capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert "cluster.pools[0].count" in r.stderr and "greater than 0" in r.stderr
    assert r.returncode != 0 and "Completely failed to parse inventory source" in r.stderr and r.stdout == ""


# ------------------------------------------------------------------------------------------ filters


@pytest.mark.parametrize("path", ["/models", "/mnt/model-store", "/a.b/.c", "/x y/ü", "/"])
def test_mount_unit_name_matches_systemd_escape(path: str) -> None:
    filters = load("fleet", "filter")
    expected = subprocess.run(["systemd-escape", "--path", "--suffix=mount", path], capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip
    assert filters.mount_unit(path) == expected


def test_version_max_is_numeric() -> None:
    filters = load("fleet", "filter")
    assert filters.version_max(["12.1", "12.10", "12.6", ""]) == "12.10"


def test_the_report_role_counts_a_node_that_recorded_nothing(tmp_path: Path) -> None:
    """The preflight_report role over two nodes (local connections), one of which recorded no check at all, as a node
    unreachable in a fact-gathering play first does: the report names it failed, and the role does not break on it
    (a `default=none` in the role's map() was no default: the task failed and no report was written)."""
    playbook = tmp_path / "report.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "One node records its ssh check, the other nothing",
                    "hosts": "all",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "name": "Record",
                            "when": "inventory_hostname == 'node-a'",
                            "exaserve.fleet.preflight_record": {
                                "checks": [{"check": "ssh", "passed": True, "observed": "connected", "expected": "SSH"}]
                            },
                        },
                        {"name": "Report", "ansible.builtin.include_role": {"name": "exaserve.fleet.preflight_report"}},
                    ],
                }
            ]
        )
    )
    report = tmp_path / "reports" / "preflight.json"
    r = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", "node-a,node-b,", "-c", "local", str(playbook),
         "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"preflight_report_path={report}",
         "-e", "exaserve_stack=test"],
        cwd=ANSIBLE_DIR, env=_ansible_env(),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert report.is_file(), r.stdout[-3000:] + r.stderr[-2000:]
    doc = json.loads(report.read_text())
    assert doc["hosts"]["node-a"]["status"] == "pass", doc["hosts"]["node-a"]
    assert doc["hosts"]["node-b"]["status"] != "pass", doc["hosts"]["node-b"]
    assert doc["summary"]["hosts"] == 2 and not doc["ok"]
    assert r.returncode == 2, "the node that recorded nothing fails its assert"
