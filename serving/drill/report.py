"""A drill's report: one JSON document and one PNG timeline (matplotlib, no display needed).

The timeline puts on one time axis (seconds from the fault): the health score of the faulted replicas (and, faint,
every other one) with the controller's stop and migrate lines and its state changes; every router instance's count
of replicas it routes to; client requests served and failed per second; the client P99 per second against the
baseline's limit. Vertical lines mark the fault, the detection, the recovery, the restoration, a takeover and the
heal, each in its own colour (:data:`MARKERS`); the PNG's ``Description`` text chunk lists the series and markers
drawn, so a reader (or a test) can tell what the picture holds without looking at it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from serving.drill.engine import Run, relevant_alerts
from serving.drill.measure import cadence_bound, p99
from serving.router.loadgen import RequestResult

MARKERS = {
    "fault": "#d62728",
    "detection": "#ff7f0e",
    "recovery": "#2ca02c",
    "restoration": "#1f77b4",
    "takeover": "#8c564b",
    "heal": "#9467bd",
}
_ROUTER_COLOURS = ("#393b79", "#bcbd22", "#e377c2", "#637939", "#17becf", "#7b4173")
_SUBJECT, _OTHER, _LIMIT = "#000000", "#c7c7c7", "#7f7f7f"


def markers(run: Run) -> dict[str, float]:
    """Marker name → seconds from the fault, for what was observed."""
    m = run.measured
    assert m is not None
    found: dict[str, float | None] = {
        "fault": 0.0,
        "detection": m.detection_s,
        "recovery": m.recovery_s,
        "restoration": m.restoration_s,
        "takeover": m.takeover_s,
        "heal": None if run.healed_at is None else run.healed_at - run.t0,
    }
    return {k: v for k, v in found.items() if v is not None}


def per_second(results: Sequence[RequestResult], start: float, end: float) -> list[tuple[float, int, int, float]]:
    """(second, served, failed, P99 s) for each whole second from ``start`` to ``end`` (by send time)."""
    out = []
    first = math.floor(start)
    buckets: dict[int, list[RequestResult]] = {}
    for r in results:
        buckets.setdefault(math.floor(r.sent_at_s), []).append(r)
    for s in range(first, math.ceil(end)):
        b = buckets.get(s, [])
        ok = sum(200 <= r.status < 300 for r in b)
        out.append((float(s), ok, len(b) - ok, p99(b)))
    return out


def timeline_png(run: Run, path: Path, title: str) -> dict[str, Any]:
    """Draw the timeline to ``path``; what was drawn (also written into the PNG as its Description)."""
    import matplotlib  # noqa: PLC0415 - only a drill that reports needs it (≈ 0.5 s to import)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    assert run.load is not None and run.measured is not None
    probes, subject = run.probes, run.subject
    ts = [p.t for p in probes]
    fig, axes = plt.subplots(4, 1, figsize=(11, 10), sharex=True, constrained_layout=True)
    score_ax, router_ax, qps_ax, p99_ax = axes
    series: list[str] = []

    urls = sorted({u for p in probes for u in p.scores})
    for url in urls:
        mine = url in subject.urls
        ys = [p.scores.get(url, math.nan) for p in probes]
        score_ax.step(
            ts, ys, where="post", color=_SUBJECT if mine else _OTHER, lw=2 if mine else 0.8, zorder=3 if mine else 2
        )
        if mine:
            series.append(f"score {url}")
            last = None
            for p in probes:
                state = p.states.get(url)
                if state is not None and state != last:
                    score_ax.annotate(state, (p.t, p.scores.get(url, 0)), fontsize=7, rotation=30, color=_SUBJECT)
                    last = state
    for line, label in ((60, "stop routing"), (30, "migrate")):
        score_ax.axhline(line, color=_LIMIT, ls="--", lw=0.8)
        score_ax.text(ts[0] if ts else 0, line + 1, label, fontsize=7, color=_LIMIT)
    score_ax.set_ylim(-5, 105)
    score_ax.set_ylabel("health score")
    score_ax.set_title(title, fontsize=10)

    for i, router in enumerate(sorted({r for p in probes for r in p.routers})):
        lists = [p.routers.get(router) for p in probes]
        ys = [math.nan if m is None else float(sum(m.values())) for m in lists]
        # the first instance drawn widest: where instances agree, each line still shows under the next
        width = max(1.0, 4.5 - 1.5 * i)
        router_ax.step(ts, ys, where="post", color=_ROUTER_COLOURS[i % len(_ROUTER_COLOURS)], lw=width, label=router)
        series.append(f"membership {router}")
    router_ax.set_ylabel("replicas routed to")
    router_ax.legend(fontsize=7, loc="lower left")

    results = run.load.results
    end = math.floor(max((r.sent_at_s for r in results), default=0.0))  # the last whole second of load
    seconds = per_second(results, -run.settings.baseline_s, end)
    xs = [s for s, *_ in seconds]
    qps_ax.step(xs, [ok for _, ok, _, _ in seconds], where="post", color=_ROUTER_COLOURS[0], label="served/s")
    qps_ax.bar(
        xs, [bad for _, _, bad, _ in seconds], width=0.9, align="edge", color=_ROUTER_COLOURS[2], label="failed/s"
    )
    qps_ax.set_ylabel("client requests/s")
    qps_ax.legend(fontsize=7, loc="lower left")
    series += ["client served/s", "client failed/s"]

    p99_ax.step(xs, [v * 1000 for *_, v in seconds], where="post", color=_ROUTER_COLOURS[3], label="P99")
    base = run.measured.baseline.p99_s
    if not math.isnan(base):
        limit = base * (1 + run.settings.gates.max_p99_rise) * 1000
        p99_ax.axhline(limit, color=_LIMIT, ls="--", lw=0.8)
        p99_ax.text(xs[0] if xs else 0, limit, f"baseline × {1 + run.settings.gates.max_p99_rise:g}", fontsize=7)
    p99_ax.set_ylabel("client P99 (ms)")
    p99_ax.set_xlabel("seconds from the fault")
    series.append("client P99")

    drawn = markers(run)
    for ax in axes:
        for name, t in drawn.items():
            ax.axvline(t, color=MARKERS[name], lw=2, label=name if ax is p99_ax else None)
    p99_ax.legend(fontsize=7, loc="upper right", ncol=4)
    what = {"series": series, "markers": drawn}
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata={"Description": json.dumps(what)})
    plt.close(fig)
    return what


def cadence_json(run: Run) -> dict[str, Any]:
    """How far apart the probes came after the fault, against the bound a judged run keeps (the gaps that broke
    it, named, make the run ``invalid``)."""
    bound = round(cadence_bound(run.settings.probe_s), 3)
    gaps = [g.to_json() for g in run.gaps]
    why = (
        "the probes of the fleet came further apart than "
        f"{bound:g} s (max(3 × {run.settings.probe_s:g} s, {run.settings.probe_s:g} s + 1 s)): "
        + ", ".join(f"{g.gap_s:.2f} s after {g.after_s:.2f} s" for g in run.gaps)
        + "; a figure seen then may have come anywhere in that gap, so the run is not judged: run the drill again "
        "on a quieter machine"
        if run.gaps
        else f"every probe within {bound:g} s of the one before"
    )
    return {"bound_s": bound, "longest_s": round(run.longest_gap_s, 3), "gaps": gaps, "why": why}


def drill_json(run: Run, stack: str, timeline: Path | None) -> dict[str, Any]:
    """The ``exaserve drill --json`` object (without the envelope's ``stack`` and ``ok``)."""
    m = run.measured
    assert m is not None
    alerts: dict[str, Any] = {"checked": run.alerts_checked}
    if run.alerts_checked:
        fired = relevant_alerts(run)
        alerts.update(
            must_fire=list(run.scenario.alerts),
            quiet=list(run.scenario.quiet),
            fired=[
                {
                    "alertname": a.alertname,
                    "labels": dict(a.labels),
                    "active_s": round(a.active_at - run.wall0, 2),
                    "fired_s": round(a.fired_at - run.wall0, 2),
                }
                for a in fired
            ],
            error=run.alerts_error,
        )
    else:
        alerts["why"] = "no Prometheus runs beside this fleet (sandbox.prometheus: false): alerts not checked"

    def r3(x: float | None) -> float | None:
        return None if x is None else round(x, 3)

    return {
        "stack": stack,
        "scenario": run.scenario.name,
        "ok": run.ok,
        "verdict": run.verdict,
        "cadence": cadence_json(run),
        "detection_s": r3(m.detection_s),
        "recovery_s": r3(m.recovery_s),
        "restoration_s": r3(m.restoration_s),
        "takeover_s": r3(m.takeover_s),
        "client_errors": m.client_errors,
        "client_requests": m.client_requests,
        "client_error_rate": round(m.client_error_rate, 6),
        "client_failures": dict(m.client_failures),
        "alerts": alerts,
        "timeline": None if timeline is None else str(timeline),
        "targets": [t.to_json() for t in run.targets],
        "checks": [c.to_json() for c in run.checks],
        "subject": run.subject.to_json(),
        "injected": run.injected,
        "healed": run.healed,
        "healed_s": None if run.healed_at is None else round(run.healed_at - run.t0, 3),
        "baseline": m.baseline.to_json(),
        "false_detections": list(m.false_detections),
        "shed": list(m.shed),  # of those, the ones the leader only shed for load or latency
        "late_blips": m.late_blips,
        "settled": run.settled,
        "rate_per_s": run.settings.rate_per_s,
        "probes": len(run.probes),
        "resolution_s": run.settings.probe_s,  # the fleet is probed this often
        # how much earlier than measured each probed time may have been (the gap since the probe before the one that
        # saw it, plus how long the injection took)
        "uncertainty_s": {name.value: s for name, s in m.uncertainty.items()},
        "injection_s": round(run.injection_s, 3),
        "fault_at": run.wall0,
    }


def write_report(run: Run, stack: str, directory: Path) -> dict[str, Any]:
    """``directory/drill.json`` and ``directory/timeline.png``; the JSON document."""
    directory.mkdir(parents=True, exist_ok=True)
    png = directory / "timeline.png"
    verdict = run.verdict if run.ok else run.verdict.upper()
    timeline_png(run, png, f"exaserve drill {run.scenario.name} (stack {stack}): {verdict}")
    doc = drill_json(run, stack, png)
    (directory / "drill.json").write_text(json.dumps(doc, indent=2) + "\n")
    return doc
