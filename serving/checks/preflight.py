"""The preflight report: which checks exist, how per-host results become the JSON report, its summary.

``ansible/preflight.yml`` records one result per host per check (the ``preflight_record`` action
plugin, through :func:`check_result`), and its last role turns them into the report with
:func:`build_report` (through the ``exaserve.fleet.preflight_report`` filter) and writes it as JSON; ``exaserve
preflight`` reads it back with :func:`load_report`. The format is documented in docs/preflight.md.

Every recorded result is a :class:`~serving.result.CheckResult` (the host is its ``subject``),
kept in the report as a :class:`CheckEntry` (the record without ``check`` and ``subject``, which are
the report's keys); :func:`results` turns a report back into records.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, Literal, TypedDict

from serving.result import CheckResult, Status

REPORT_VERSION = 1
CheckStatus = Literal["pass", "fail", "skip"]  # preflight never warns: a node is fit or it is not
_ENTRY_STATUS: dict[Status, CheckStatus] = {Status.PASS: "pass", Status.FAIL: "fail", Status.SKIP: "skip"}
HostStatus = Literal["pass", "fail", "unreachable"]

# Every check preflight can record, in report and table order, with what it proves.
CHECKS: dict[str, str] = {
    "ssh": "SSH reachable as the pool's user, host key verified against known_hosts",
    "play": "every selected check ran to the end (the node did not leave the play on a task error)",
    "os_release": "OS ID and VERSION_ID match cluster.host.os_id/os_version",
    "kernel": "running kernel ≥ cluster.host.min_kernel",
    "cgroup_v2": "unified cgroup v2 hierarchy at /sys/fs/cgroup",
    "gpu_count": "nvidia-smi lists cluster.gpu.count_per_node GPUs",
    "gpu_product": "every GPU is cluster.gpu.product",
    "gpu_memory": "every GPU has ≥ 95 % of cluster.gpu.memory_gb",
    "driver": "NVIDIA driver ≥ cluster.host.min_driver, the same on every GPU",
    "cuda": "CUDA the driver supports ≥ cluster.host.min_cuda and ≥ the serving image's CUDA",
    "ib_ports": "every HCA in cluster.fabric.hcas present, each port State Active, Physical state LinkUp",
    "ib_rate": "every HCA port at cluster.fabric.link_rate_gbps",
    "container_runtime": "container runtime answers and has the NVIDIA runtime configured",
    "container_gpu": "the NVIDIA container toolkit sees every GPU (what a container gets with --gpus all)",
    "ntp_sync": "chronyd synchronised to a source",
    "ntp_offset": "|clock offset| ≤ cluster.ntp.max_offset_ms",
    "model_store": "the shared model store is mounted at storage.model_store.mount_path",
    "model_present": "model.path on the store holds config.json and weights",
    "cache_disk": "free disk for the local cache ≥ cluster.host.min_free_disk_gb",
    "system_cpu": "a system-pool node has ≥ cluster.system_pool.cpu CPUs online",
    "system_memory": "a system-pool node has ≥ cluster.system_pool.memory_gb of memory",
    "system_untainted": "a system-pool node's kubelet registers no nvidia.com/gpu taint (routers, controllers tolerate none)",
    "rack_peers": "every reachable node of the rack answers ping, bounded average round-trip time",
    "rack_leaders": "the first reachable node of every rack answers ping, bounded average round-trip time",
    "fabric_pair": "all-reduce busbw between node pairs ≥ the fabric's share of cluster.fabric.link_rate_gbps",
    "fabric_rack": "all-reduce busbw within the rack ≥ the fabric's share of cluster.fabric.link_rate_gbps",
}


class CheckEntry(TypedDict):
    """One check of one host in the report (Ansible keeps it as a fact, so a plain mapping)."""

    status: CheckStatus
    observed: str
    expected: str
    fix: str | None


class HostReport(TypedDict):
    status: HostStatus
    failed_checks: list[str]
    checks: dict[str, CheckEntry]


class Summary(TypedDict):
    hosts: int
    passed: int
    failed: int
    unreachable: int


class Report(TypedDict):
    version: int
    stack: str
    ok: bool
    summary: Summary
    checks: list[str]
    hosts: dict[str, HostReport]


class ReportError(ValueError):
    """A report file that is missing or not in this format (message names the path and the problem)."""


def record(check: str, item: Mapping[str, Any]) -> CheckResult:
    """One recorded check as the result record: ``passed`` (bool) or ``skip`` (reason); fix only when failing."""
    if check not in CHECKS:
        raise ValueError(f"unknown preflight check {check!r}; known: {', '.join(CHECKS)}")
    expected = str(item.get("expected", ""))
    skip = item.get("skip")
    if skip:
        return CheckResult(check, Status.SKIP, str(skip), expected)
    if "passed" not in item:
        raise ValueError(f"check {check!r}: give 'passed' (true/false) or 'skip' (the reason)")
    passed = item["passed"]
    if not isinstance(passed, bool):
        raise ValueError(f"check {check!r}: passed={passed!r} must be a boolean")
    fix = item.get("fix")
    return CheckResult(
        check,
        Status.PASS if passed else Status.FAIL,
        str(item.get("observed", "")),
        expected,
        None if passed or not fix else str(fix),
    )


def entry(result: CheckResult) -> CheckEntry:
    """The report's form of a record (its check and host are the report's keys)."""
    return {
        "status": _ENTRY_STATUS[result.status],
        "observed": result.observed,
        "expected": result.expected,
        "fix": result.fix,
    }


def check_result(check: str, item: Mapping[str, Any]) -> CheckEntry:
    """Normalise one recorded check into its report entry (what ``preflight_record`` stores as a fact)."""
    return entry(record(check, item))


ABORTED = CheckResult(
    "play",
    Status.FAIL,
    "the node left the play after a task error; the checks after it did not run",
    "every selected check runs and records a result",
    "Read this node's failed task in the ansible-playbook output (rerun with -vvv --limit NODE), fix the "
    "cause on the node or report the playbook error, then rerun preflight.",
)
NOTHING_RECORDED = CheckResult(
    "ssh",
    Status.FAIL,
    "no check recorded a result (the host left the play early)",
    "every selected check runs",
    "Rerun with -v and read this host's failed task; fix it, then rerun preflight.",
)


def host_report(checks: Mapping[str, CheckEntry], *, aborted: bool = False) -> HostReport:
    """A host's status: unreachable when SSH failed, fail when any check failed, nothing was recorded
    or the host left the play on an error (``aborted``), else pass."""
    checks = {**checks, "play": entry(ABORTED)} if aborted else checks
    ordered = {c: checks[c] for c in CHECKS if c in checks}
    failed = [c for c, r in ordered.items() if r["status"] == "fail"]
    if not ordered:
        ordered = {"ssh": entry(NOTHING_RECORDED)}
        failed = ["ssh"]
    status: HostStatus = "unreachable" if "ssh" in failed else ("fail" if failed else "pass")
    return {"status": status, "failed_checks": failed, "checks": ordered}


def build_report(
    stack: str, results: Mapping[str, Mapping[str, CheckEntry] | None], *, aborted: Collection[str] = ()
) -> Report:
    """The whole report from ``{host: {check: result}}`` (``None`` for a host that recorded nothing);
    ``aborted`` names hosts that left the play on an unexpected task error."""
    unknown = sorted(set(aborted) - set(results))
    if unknown:
        raise ValueError(f"aborted hosts {unknown} have no entry in the results")
    hosts = {h: host_report(r or {}, aborted=h in aborted) for h, r in results.items()}
    summary: Summary = {
        "hosts": len(hosts),
        "passed": sum(h["status"] == "pass" for h in hosts.values()),
        "failed": sum(h["status"] == "fail" for h in hosts.values()),
        "unreachable": sum(h["status"] == "unreachable" for h in hosts.values()),
    }
    used = {c for h in hosts.values() for c in h["checks"]}
    return {
        "version": REPORT_VERSION,
        "stack": stack,
        "ok": summary["passed"] == summary["hosts"],
        "summary": summary,
        "checks": [c for c in CHECKS if c in used],
        "hosts": hosts,
    }


def results(report: Report) -> list[CheckResult]:
    """Every check of every host of a report as result records (the host is the subject), in report order."""
    return [
        CheckResult(check, Status(e["status"]), e["observed"], e["expected"], e["fix"], host)
        for host, hr in report["hosts"].items()
        for check, e in hr["checks"].items()
    ]


def summary_lines(report: Report) -> list[str]:
    """Human summary: one headline, then one line per failing check of each failing host, with its fix."""
    s = report["summary"]
    lines = [
        f"preflight {report['stack']}: {s['passed']}/{s['hosts']} nodes pass, {s['failed']} failing, "
        f"{s['unreachable']} unreachable"
    ]
    lines += [f"{r.subject} {r.check}: {r.message}" for r in results(report) if r.status is Status.FAIL]
    return lines


def load_report(path: Path) -> Report:
    """Read a report written by preflight.yml; :class:`ReportError` names what is wrong."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ReportError(f"{path}: no preflight report (the playbook did not reach its report role)") from None
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("version") != REPORT_VERSION or not isinstance(doc.get("hosts"), dict):
        raise ReportError(f"{path}: not a version {REPORT_VERSION} preflight report")
    report: Report = doc  # type: ignore[assignment]
    return report
