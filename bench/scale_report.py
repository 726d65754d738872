"""scale_bench.py's figures as a table (``bench/scale_bench.py`` without ``--json``)."""

from __future__ import annotations

from typing import Any


def print_table(f: dict[str, Any]) -> None:
    for refused in f.get("refused", []):
        print(f"== {refused['replicas']} replicas refused by sandbox up: {refused['reason']}")
    a = f["bring_up"]
    print(
        f"== {a['replicas']} replicas on {a['nodes']} nodes, {a['routers']} routers, {a['controllers']} controllers, "
        f"{a['worker_processes']} worker and {a['agent_processes']} agent processes; machine {f['machine']}; "
        f"sandbox up {a['up_s']:.0f} s"
    )
    for key, show in (
        ("reference", print_reference),
        ("rollout", print_rollout),
        ("node_loss", print_node_loss),
        ("scheduling", print_scheduling),
    ):
        if key in f:
            show(f[key], f)


def print_reference(ref: dict[str, Any], f: dict[str, Any]) -> None:
    print(f"1. over {ref['window_s']:.0f} s with everything registered (heartbeat {ref['heartbeat_s']:g} s):")
    for row in ref["routers"]:
        print(
            f"   {row['name']:<9} RSS {row['rss_mib']:6.1f} MiB  open files {row['open_files']:5d}  registration CPU "
            f"{row['registration_cpu_s']:6.1f} s  CPU now {row['cpu_share']:6.1%}  health checks "
            f"{row['health_checks_per_s']:6.1f}/s, {row['health_check_failures']:.1%} failing"
        )
    hc = ref["health_checks_per_s"]
    print(
        f"   healthy workers per router {ref['healthy_workers_per_router']}; /health on the workers: routers "
        f"{hc['routers']}/s (expected {hc['routers_expected']}), agents {hc['agents']}/s (expected {hc['agents_expected']})"
    )
    print(
        "   all requests on the workers/s: "
        + ", ".join(f"{k} {v:.1f}" for k, v in list(ref["worker_requests_per_s"].items())[:6])
    )
    hb = ref["heartbeats"]
    print(
        f"   controller-0: aggregated {hb['aggregated_measured_per_s']} msg/s (planner "
        f"{hb['aggregated_planner_per_s']:.1f}), {hb['replicas_probed_per_message']} replicas probed per message; "
        f"direct would be {hb['direct_planner_per_s']:.1f} msg/s"
    )
    print(
        "   cores: "
        + ", ".join(f"{k} {v:.2f}" for k, v in ref["cores"].items())
        + "; RSS MiB: "
        + ", ".join(f"{k} {v:.0f}" for k, v in ref["rss_mib"].items())
        + f"; CPU per request on a worker process {ref['worker_cpu_ms_per_request']} ms, per agent probe "
        f"{ref['agent_cpu_ms_per_probe']} ms"
    )
    cpu = f["bring_up"]["cpu"]
    print(
        f"   sandbox up's prediction from costs measured alone ({cpu['request_ms']} ms a request, {cpu['probe_ms']} ms "
        "a probe): " + ", ".join(f"{k} {v:.2f}" for k, v in cpu["cores_needed"].items())
    )


def print_rollout(r: dict[str, Any], f: dict[str, Any]) -> None:
    if "error" in r:
        print(f"2. rollout of {r['replicas']} replicas: {r['outcome']}: {r['error']}")
        r = {**r, "per_batch": [], "router_api_calls": {}}
    else:
        full = "extrapolated from the batches run" if r["full_rollout_extrapolated"] else "measured"
        print(
            f"2. rollout of {r['replicas']} replicas ({r['outcome']}, {r['batches_run']} of {r['batches_planned']} "
            f"batches passed), batches {r['batch_sizes']}, {r['routers']} routers, {f['rate']:g} req/s: journal "
            f"{r['journal_span_s']} s (CLI {r['cli_wall_s']} s); all {r['batches_planned']} batches {r['full_rollout_s']} s "
            f"({full}) against {r['configured_wait_s']} s configured: overhead ratio {r['overhead_ratio']}; client "
            f"errors {r['client_errors']} of {r['client_requests']}, P99 {r['client_p99_ms']} ms"
        )
        if r["reason"]:
            print(f"   {r['reason']}")
    for row in r["per_batch"]:
        print(
            f"   batch {row['batch']}{'' if row['passed'] else ' (cut short)'}: {row['span_s']} s "
            f"({r['configured_wait_per_batch_s']} s configured waits); out of "
            f"every router {row.get('remove_s_slowest_router')} s, back on every router "
            f"{row.get('readmit_s_slowest_router')} s (slowest router); cores "
            + ", ".join(f"{k} {v:.2f}" for k, v in row.get("cores", {}).items())
        )
    for key, c in r["router_api_calls"].items():
        print(
            f"   {key:<22} {c['per_batch']:8.1f} calls per batch (all routers), {c['router_handler_ms']:7.2f} ms in the "
            "router's handler"
        )


def print_node_loss(n: dict[str, Any], _f: dict[str, Any]) -> None:
    print(
        f"3. node loss ({n['node']}, {n['replicas']} replicas, {n['client_rate_per_s']:g} req/s): routers all-unhealthy "
        f"at {n['routers_all_unhealthy_s']} s (bound {n['router_detection_bound_s']:g} s); out of every router "
        f"{n['out_of_every_router_s']} s (plan {n['planned_out_s']:g} s); migrated {n['migrated_s']} s (plan "
        f"{n['planned_migrate_s']:g} s); readmitted {n['readmitted']} (node score {n['node_score_at_end']}, "
        f"≥ {n['readmission_needs_s']:.0f} s more); client errors {n['client_errors']} of {n['client_requests']}, "
        f"P99 {n['client_p99_ms']} ms"
    )


def print_scheduling(sch: dict[str, Any], _f: dict[str, Any]) -> None:
    knee = sch["knee_direct_replicas"]
    most = max(t["replicas"] for t in sch["trials"])
    where = f"at {knee} replicas" if knee else f"none up to {most} replicas"
    print(
        f"4. scheduling period, jitter = {sch['jitter_rule']}: knee of direct reports {where} "
        f"(source: above {sch['source_claim_replicas']})"
    )
    print("   mode        replicas period  msg/s (planner)  late p50/p99/max ms      work p50/p99 ms  CPU")
    for t in sch["trials"]:
        late, work = t["late_ms"], t["work_ms"]
        print(
            f"   {t['mode']:<11} {t['replicas']:8d} {t['period_ms']:4d} ms {t['messages_per_s']:7.1f} "
            f"({t['planner_per_s']:6.1f})  {late['p50']:6.2f}/{late['p99']:7.2f}/{late['max']:7.2f}   "
            f"{work['p50']:6.2f}/{work['p99']:6.2f}   {t['cpu_share']:5.1%}"
        )
