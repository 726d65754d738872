"""scale_bench.py's sections on the running sandbox (``bench/scale_bench.py``): 1. the reference size, 2. the rollout,
3. node loss. Section 4, the scheduling period, runs processes of its own: ``bench/scale_scheduling.py``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from bench.scale_sandbox import Load, Scale, cpu_of, host_counts, leader, open_files
from serving.rollout.journal import load_state
from serving.sandbox.processes import SandboxError, cpu_seconds, rss_mib
from serving.sandbox.runtime import router_urls
from serving.sandbox.worker_host import stop_hosted
from serving.sglang_health import SCHEDULER_HEALTH_PATH
from tests.support.cli import exaserve_started, json_object
from tests.support.controllers import status

ROUTER_CLIENT = "-"  # the router sends no User-Agent; the agents are exaserve-agent, the updater python-httpx
# an agent's probe as a worker host counts it (method, path, client): the scheduler's health, which the agents ask
# (counted as /health until they moved to /health_generate, the bench then saw no probe and 2e11 ms of CPU per probe)
AGENT_PROBE = f"GET {SCHEDULER_HEALTH_PATH} exaserve-agent"


# ----- 1: the reference size -----------------------------------------------------------------------------------------
_HEALTH_CHECKS = re.compile(r'^smg_worker_health_checks_total\{[^}]*result="(\w+)"[^}]*\} (\S+)$')


def health_checks(metrics_url: str) -> dict[str, float]:
    """A router's health checks so far by result (``success``, ``failure``)."""
    out: dict[str, float] = {}
    for line in httpx.get(metrics_url, timeout=120).text.splitlines():
        if m := _HEALTH_CHECKS.match(line):
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def reference(sc: Scale, window_s: float) -> dict[str, Any]:
    """With the whole fleet registered, over ``window_s``: each router's memory, open files, CPU share and health
    checks by result, the healthy workers each router lists; what the workers served (by path and client, counted
    inside the worker processes) against what the routers' and agents' intervals call for; controller-0's messages
    against the planner's and the replicas probed per message (the aggregation ratio); every kind of process's CPU
    and memory, and the CPU per worker request and per agent probe."""
    kinds = ("router", "worker-host", "agent", "controller", "etcd")
    groups = {k: sc.records(k) for k in kinds}
    routers, ctl = groups["router"], sc.state.read("controller-0")
    assert ctl is not None
    cpu0, each0 = {k: cpu_of(v) for k, v in groups.items()}, {r.name: cpu_seconds(r.pid) for r in routers}
    checks0 = {r.name: health_checks(r.metrics_url) for r in routers}
    counts0, accepted0, t0 = host_counts(sc), status(ctl.url, 30)["reports"]["accepted"], time.monotonic()
    time.sleep(window_s)
    counts1, accepted1, t1 = host_counts(sc), status(ctl.url, 30)["reports"]["accepted"], time.monotonic()
    checks1 = {r.name: health_checks(r.metrics_url) for r in routers}
    dt = t1 - t0
    cores = {k: (cpu_of(v) - cpu0[k]) / dt for k, v in groups.items()}
    rates = {k: (counts1.get(k, 0) - counts0.get(k, 0)) / dt for k in counts1}
    replicas, interval = len(sc.plan.replicas), sc.spec.serving.heartbeat_interval_s
    healthy = [
        sum(w["is_healthy"] for w in httpx.get(r.url + "/workers", timeout=120).json()["workers"]) for r in routers
    ]
    rows = []
    for r in routers:
        done = {k: checks1[r.name].get(k, 0.0) - checks0[r.name].get(k, 0.0) for k in ("success", "failure")}
        rows.append({
            "name": r.name, "rss_mib": round(rss_mib(r.pid), 1), "open_files": open_files(r.pid),
            "cpu_share": round((cpu_seconds(r.pid) - each0[r.name]) / dt, 3),
            "health_checks_per_s": round(sum(done.values()) / dt, 1),
            "health_check_failures": round(done["failure"] / max(sum(done.values()), 1), 3),
        })  # fmt: skip
    messages = (accepted1 - accepted0) / dt
    hb = sc.plan.heartbeats
    return {
        "window_s": round(dt, 1),
        "heartbeat_s": interval,
        "routers": rows,
        "healthy_workers_per_router": healthy,
        "health_checks_per_s": {
            "routers": round(rates.get(f"GET /health {ROUTER_CLIENT}", 0.0), 1),
            "routers_expected": round(len(routers) * replicas / interval, 1),
            "agents": round(rates.get(AGENT_PROBE, 0.0), 1),
            "agents_expected": round(replicas / interval, 1),
        },
        "worker_requests_per_s": {k: round(v, 1) for k, v in sorted(rates.items(), key=lambda kv: -kv[1]) if v > 0},
        "heartbeats": {
            "aggregated_measured_per_s": round(messages, 1),
            "replicas_probed_per_message": round(rates.get(AGENT_PROBE, 0.0) / max(messages, 1e-9), 2),
            "aggregated_planner_per_s": hb.aggregated_per_s.value,
            "direct_planner_per_s": hb.direct_per_s.value,
        },
        "cores": {k: round(v, 2) for k, v in cores.items()},
        "rss_mib": {k: round(sum(rss_mib(r.pid) for r in v), 1) for k, v in groups.items()},
        "worker_cpu_ms_per_request": round(cores["worker-host"] / max(sum(rates.values()), 1e-9) * 1000, 3),
        "agent_cpu_ms_per_probe": round(cores["agent"] / max(rates.get(AGENT_PROBE, 0.0), 1e-9) * 1000, 2),
    }


# ----- 2: the rollout ------------------------------------------------------------------------------------------------
_ROUTER_CALL = re.compile(
    r'^(smg_http_requests_total|smg_http_request_duration_seconds_sum)\{method="(\w+)",path="([^"]*)"\} (\S+)$'
)
_PER_ROUTER = re.compile(r"(http://\S+) ([\d.]+) s")
# serving.rollout.runner.asked_again_note: "…after a time-out: 2 of 2048 (gpu-…, …) at the start, 0 of 2048 at the end"
_ASKED_AGAIN = re.compile(r"after a time-out: (\d+) of \d+.*? at the start, (\d+) of \d+")


def asked_again(detail: str) -> list[int]:
    """The two counts of a soak's or the baseline's :func:`~serving.rollout.runner.asked_again_note` ([0, 0] when the
    detail has none: nothing was asked again); a note the pattern does not read is an error, not a 0."""
    found = _ASKED_AGAIN.findall(detail)
    if len(found) > 1 or (not found and "asked again after a time-out" in detail):
        raise ValueError(f"cannot read the second asks in {detail!r}")
    return [int(n) for n in found[0]] if found else [0, 0]


def router_calls(metrics_urls: list[str]) -> dict[str, list[float]]:
    """``METHOD /path`` (worker ids as ``{id}``) → [calls, seconds in the router's handler], summed over routers."""
    out: dict[str, list[float]] = {}
    for url in metrics_urls:
        for line in httpx.get(url, timeout=60).text.splitlines():
            m = _ROUTER_CALL.match(line)
            if m is None:
                continue
            name, method, path, value = m.groups()
            key = f"{method} {re.sub(r'^/workers/.+', '/workers/{id}', path)}"
            slot = out.setdefault(key, [0.0, 0.0])
            slot[0 if name == "smg_http_requests_total" else 1] += float(value)
    return out


def soaked(journal: Path, batch: int) -> bool:
    """Whether the journal records ``batch``'s soak passed."""
    state = load_state(journal)
    return state is not None and bool(state.batches[batch].passed)


ROLLOUT_CPU_KINDS = ("router", "worker-host", "agent", "controller", "etcd")


def cpu_by_kind(sc: Scale, updater: int) -> dict[str, float]:
    """CPU seconds so far of each kind of the sandbox's processes and of the updater (pid ``updater``)."""
    out = {k: cpu_of(sc.records(k)) for k in ROLLOUT_CPU_KINDS}
    with contextlib.suppress(SandboxError):  # it has exited
        out["updater"] = cpu_seconds(updater)
    return out


def run_rollout(
    sc: Scale, journal: Path, batches: int | None, cpu: list[tuple[float, dict[str, float]]]
) -> subprocess.CompletedProcess[str]:
    """``exaserve rollout --to rehearsal``; with ``batches``, paused (SIGINT, as an operator's Ctrl-C) once that many
    batches passed their soak. The updater pauses where every replica is in the router: when the next batch already
    started leaving (it starts at once after the soak), it is brought back first, and shown as cut short. Appends
    ``(time.time(), CPU seconds by kind)`` to ``cpu`` every half second while it runs."""
    # a router that a rollout's changes keep busy may answer its metrics late (3 routers on 2 cores beside 2,048
    # workers): a longer grace than the default 30 s
    args = ("rollout", "--to", "rehearsal", "--json", "--router-grace-s", "600", "--stack-file", str(sc.stack_file))
    output = sc.state_dir / "rollout-cli"  # files, not pipes: its progress at scale fills a pipe and blocks it
    proc = exaserve_started(*args, env=sc.env, to=output)
    paused = False
    try:
        while proc.poll() is None:
            cpu.append((time.time(), cpu_by_kind(sc, proc.pid)))
            if batches is not None and not paused and soaked(journal, batches - 1):
                proc.send_signal(signal.SIGINT)
                paused = True
            time.sleep(0.5)
    finally:  # the bench interrupted: the rollout holds the stack's lock, and `sandbox down` waits for no updater
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()  # its lock is an flock: released when the process dies
    proc.wait(60)
    out, err = (output.with_suffix(suffix).read_text() for suffix in (".out", ".err"))
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def cores_between(cpu: list[tuple[float, dict[str, float]]], start: float, end: float) -> dict[str, float]:
    """Cores by kind of process between wall-clock times ``start`` and ``end``, from the samples nearest to them."""
    if not cpu:
        return {}
    (t0, a), (t1, b) = (min(cpu, key=lambda sample: abs(sample[0] - t)) for t in (start, end))
    return {k: round((b[k] - a[k]) / (t1 - t0), 3) for k in a if k in b} if t1 > t0 else {}


def rollout(sc: Scale, rate: float, batches: int | None) -> dict[str, Any]:
    metrics = [r.metrics_url for r in sc.records("router")]
    journal = sc.state.root.parent / "rollout" / "journal.jsonl"
    with Load(sc.router_url, rate) as load:
        time.sleep(10)
        dry = json_object(sc.cli("rollout", "--to", "rehearsal", "--dry-run", "--json"))
        before, started = router_calls(metrics), time.monotonic()
        cpu: list[tuple[float, dict[str, float]]] = []
        run = run_rollout(sc, journal, batches, cpu)
        wall = time.monotonic() - started
        after = router_calls(metrics)
        report = load.gen.report()
    if not journal.is_file():  # refused before its first batch: say why instead of timing nothing
        return {
            "replicas": len(sc.plan.replicas),
            "outcome": f"did not start (exit {run.returncode})",
            "error": (run.stdout[-1500:] + " | " + run.stderr[-1500:]).strip(" |"),
        }
    outcome = json_object(run)
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    span = records[-1]["written_at"] - records[0]["written_at"]
    planned = len(dry["batches"])
    per_batch: list[dict[str, Any]] = []
    for b in range(planned):
        # the batch's own records (the first is the plan), forward path only; it began when the record before them
        # was written (the baseline or the previous batch's soak) and its first record is its removal, done
        mine = [i for i, rec in enumerate(records[1:], 1)
                if (step := rec["event"].get("step") or {}).get("batch") == b and not step.get("rollback")]  # fmt: skip
        if not mine:
            continue
        row: dict[str, Any] = {
            "batch": b,
            "span_s": round(records[mine[-1]]["written_at"] - records[mine[0] - 1]["written_at"], 1),
            "ends_at": records[mine[-1]]["written_at"],
            "passed": any(
                records[i]["event"]["step"]["phase"] == "soak" and records[i]["event"]["kind"] == "done" for i in mine
            ),
        }
        row["cores"] = cores_between(cpu, records[mine[0] - 1]["written_at"], records[mine[-1]]["written_at"])
        for i in mine:
            ev = records[i]["event"]
            if ev["step"]["phase"] in ("remove", "readmit"):
                seconds = [float(s) for _u, s in _PER_ROUTER.findall(ev["detail"])]
                row[f"{ev['step']['phase']}_s_slowest_router"] = max(seconds) if seconds else None
            if ev["step"]["phase"] == "soak":  # the soak's two reads: replicas that answered only a second ask
                row["soak_asked_again"] = asked_again(ev["detail"])
        per_batch.append(row)
    baseline = next((rec["event"]["detail"] for rec in records[1:] if rec["event"]["kind"] == "baseline"), "")
    passed = [row for row in per_batch if row["passed"]]  # a batch the pause cut short is shown, not extrapolated
    ran = len(passed)
    calls = {
        k: {
            "per_batch": round((after[k][0] - before.get(k, [0, 0])[0]) / max(len(per_batch), 1), 1),
            "router_handler_ms": round(
                (after[k][1] - before.get(k, [0, 0])[1]) / max(after[k][0] - before.get(k, [0, 0])[0], 1) * 1000, 2
            ),
        }
        for k in after
        if k.split()[1].startswith("/workers") and after[k][0] > before.get(k, [0, 0])[0]
    }
    timings = dry["timings"]
    full: float | None = span  # every batch passed: measured
    if ran < planned:  # paused after `ran` batches passed: up to the last one's soak, the rest at their mean
        mean = sum(row["span_s"] for row in passed) / ran if ran else None
        full = passed[-1]["ends_at"] - records[0]["written_at"] + (planned - ran) * mean if mean else None
    return {
        "replicas": len(sc.plan.replicas),
        "routers": len(metrics),
        "outcome": outcome.get("outcome"),
        "reason": outcome.get("reason"),
        "batches_run": ran,
        "batches_planned": planned,
        "batch_sizes": [len(b["replicas"]) for b in dry["batches"]],
        "configured_wait_s": dry["configured_wait_s"],
        "configured_wait_per_batch_s": timings["warmup_s"] + timings["interval_s"],
        "journal_span_s": round(span, 1),
        "cli_wall_s": round(wall, 1),
        "full_rollout_s": round(full, 1) if full is not None else None,
        "full_rollout_extrapolated": ran < planned,
        "overhead_ratio": round(full / dry["configured_wait_s"], 2) if full is not None else None,
        "baseline_asked_again": asked_again(baseline),
        "per_batch": [{k: v for k, v in row.items() if k != "ends_at"} for row in per_batch],
        "router_api_calls": calls,
        "client_requests": report.count,
        "client_errors": report.errors,
        "client_p99_ms": round(report.p99_s * 1000, 1),
    }


# ----- 3: node loss --------------------------------------------------------------------------------------------------
def node_loss(sc: Scale, rate: float) -> dict[str, Any]:
    spec = sc.spec
    assert spec.sandbox is not None
    node = sc.plan.replicas[len(sc.plan.replicas) // 2].node.name
    victims = [r for r in sc.plan.replicas if r.node.name == node]
    ports = [r.endpoint.port for r in victims]
    urls = {r.url for r in victims}
    iv = spec.serving.heartbeat_interval_s
    window = (sc.plan.heartbeats.timeouts_to_migrate.value + 2) * iv + 10
    unhealthy: dict[str, float] = {}
    with Load(sc.router_url, rate) as load:
        time.sleep(5)
        wall0, t0 = time.time(), time.monotonic()
        asyncio.run(stop_hosted(sc.state, ports, stop_timeout_s=0))
        acts: list[dict[str, Any]] = []
        while time.monotonic() - t0 < window:
            for router in router_urls(spec):
                workers = httpx.get(router + "/workers", timeout=30).json()["workers"]
                if all(not w["is_healthy"] for w in workers if w["url"] in urls) and router not in unhealthy:
                    unhealthy[router] = time.monotonic() - t0
            lead = leader(sc)
            acts = [a for a in lead["actions"] if a["url"] in urls and a["at"] >= wall0 and a["ok"]]
            if {a["url"] for a in acts if a["kind"] == "migrate"} == urls and len(unhealthy) == len(router_urls(spec)):
                break
            time.sleep(2)  # each GET /workers of 2,048 costs a router ≈ 0.1 s of CPU
        lead = leader(sc)
        node_score = next(n["score"] for n in lead["nodes"] if n["name"] == node)
        time.sleep(2)
    report = load.gen.report()

    def when(kind: str) -> list[float]:
        return sorted(a["at"] - wall0 + (a["seconds"] if kind == "remove" else 0.0) for a in acts if a["kind"] == kind)

    removed, migrated, readmitted = when("remove"), when("migrate"), when("readmit")
    health = spec.health
    return {
        "node": node,
        "replicas": len(ports),
        "routers_all_unhealthy_s": sorted(round(v, 1) for v in unhealthy.values()),
        "router_detection_bound_s": spec.serving.failure_threshold * iv + spec.serving.health_check_timeout_s,
        "out_of_every_router_s": [round(removed[0], 1), round(removed[-1], 1)] if removed else None,
        "planned_out_s": sc.plan.heartbeats.timeouts_to_stop_routing.value * iv,
        "migrated_s": [round(migrated[0], 1), round(migrated[-1], 1)] if migrated else None,
        "planned_migrate_s": sc.plan.heartbeats.timeouts_to_migrate.value * iv,
        "readmitted": len({a["url"] for a in acts if a["kind"] == "readmit"}),
        "readmitted_s": [round(readmitted[0], 1), round(readmitted[-1], 1)] if readmitted else None,
        "node_score_at_end": node_score,
        "readmission_needs_s": max(0, health.readmit_at - node_score) / health.success_reward * iv,
        "client_rate_per_s": rate,
        "client_requests": report.count,
        "client_errors": report.errors,
        "client_p99_ms": round(report.p99_s * 1000, 1),
    }
