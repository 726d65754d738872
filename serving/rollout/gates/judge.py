"""The judgement of one soak window: the canary against its peers, every replica outside the batch against the rest,
into a verdict — pure.

The groups (the runner picks them from the rollout's state): the **canary** is the batch being soaked. Its
**baseline** is, in order of preference: the replicas *not yet updated* (the old version, same window);
for the last batch, where none remain, the replicas *updated earlier* whose batches already passed (same
window; they were themselves judged against the old version, so a regression of the release was caught
then and what is left to catch is one confined to this batch); for a single-batch rollout, where nobody
else runs at all, the *pre-rollout* per-replica figures of the baseline window.

The verdict (:class:`Verdict`):

* **rollback** — a breach confined to the canary: its QPS per replica more than 20 % under the baseline's,
  its P99 (or its median: the whole distribution) more than 30 % over the baseline's, its error rate over 0.1 %,
  or a canary replica down.
* **pause** — evidence outside the batch, naming the replicas: a replica outside the canary down, failing
  more than 0.1 % of its requests, or slower than its peers beyond the P99 limit; clients getting errors that no replica's failures explain; or traffic so thin that the batch
  cannot be judged although the baseline window saw enough. A pause never rolls the new version back;
  the operator fixes the fleet and resumes (the soak runs again), or rolls back.
* **pass** — otherwise. Weather that hits canary and baseline alike (a traffic dip, a fleet-wide slowdown
  since the rollout began) does not change a same-window comparison; the verdict names it as context.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from serving.rollout.gates.findings import (
    DRY_RUN_FINDINGS,
    FAMILY_ALPHA,
    MIN_REQUESTS,
    Finding,
    down_check,
    error_check,
    p99_check,
    qps_check,
    refusal_check,
)
from serving.rollout.gates.verdict import BASIS_WORDS, Basis, Decision, Gates, Verdict
from serving.rollout.gates.window import (
    GroupStats,
    ReplicaWindow,
    WindowStats,
    group_stats,
    median_of,
    merge_histograms,
    p99_of,
)
from serving.rollout.plan import GateLimits


def judge(
    canary: Sequence[str],
    peers: Sequence[str],
    windows: Mapping[str, ReplicaWindow],
    *,
    basis: Basis,
    seconds: float,
    fleet: WindowStats,
    before: WindowStats | None,
    limits: GateLimits,
    accept_inconclusive: bool = False,
) -> Gates:
    """The verdict on one soak window.

    ``windows`` holds every replica measured (the canary, its ``peers`` — the baseline of ``basis`` — and any
    other replica in the router, e.g. those updated earlier while old-version peers remain). ``fleet`` is the
    router-wide window, ``before`` the pre-rollout baseline (its ``replicas`` is the reference of
    ``pre-rollout`` and the fallback reference of a replica without peers). A window shorter than
    ``limits.qps_window_min_s`` shows the canary's QPS but does not judge it: the router decided that split.

    A gate that too little traffic leaves unjudged is *inconclusive* (as Argo Rollouts calls such an analysis): with
    no breach and no evidence outside the batch the verdict is a pause that says how much traffic the soak needs,
    never a pass; ``accept_inconclusive`` (the operator's ``--accept-inconclusive``) passes it, saying so, a traffic
    dip that left the canary too few requests included (without it, evidence outside the batch: a pause). Every
    unjudged gate is named in :attr:`Gates.inconclusive` with the reason."""
    outside_ids = [r for r in windows if r not in canary]
    pre = before.replicas if before is not None else None
    alpha = FAMILY_ALPHA / (2 + len(outside_ids))

    # Evidence outside the batch: each replica that is not the canary, against its peers without it.
    outside: list[Finding] = down_check(windows, outside_ids)
    outside += [f for r in outside_ids if (f := error_check(r, [r], windows, limits)) is not None]
    broken = {r: "down" if windows[r].problems else "failing" for f in outside for r in f.replicas}
    peer_windows = {r: windows[r] for r in peers if r in windows}
    clean = {r: w for r, w in peer_windows.items() if r not in broken}
    clean_latency = merge_histograms(w.latency for w in clean.values())
    for r in outside_ids:  # each against the clean peers without it: the peers' histogram minus its own
        if r in broken:
            continue
        own = windows[r].latency
        rest = clean_latency - own if r in clean and clean_latency is not None and own is not None else clean_latency
        peers_left = len(clean) > (r in clean)
        if peers_left:
            rest_p99, rest_median, rest_count = p99_of(rest), median_of(rest), rest.count if rest is not None else 0.0
        elif pre is not None:
            rest_p99, rest_median, rest_count = pre.p99_s, pre.median_s, pre.timed_requests
        else:
            rest_p99, rest_median, rest_count = None, None, 0.0
        if (f := p99_check(r, [r], windows, rest_p99, limits, alpha, rest_median, rest_count)[1]) is not None:
            outside.append(f)
    # A gate in dry run (rollout.dry_run_gates, Argo Rollouts' analysis dryRun) is measured and shown, never decisive:
    # its findings on a peer do not take that peer out of the reference either
    dry_gates = {gate for name in limits.dry_run for gate in DRY_RUN_FINDINGS[name]}
    flagged = {r for f in outside if f.gate not in dry_gates for r in f.replicas}

    # The canary against the clean peers (or the pre-rollout figures).
    reasons = {r: broken.get(r, "slower than its peers") for r in peer_windows if r in flagged}
    reference = group_stats(peer_windows, seconds, reasons)
    if basis == "pre-rollout" and pre is not None:
        reference = pre
    members = [r for r in canary if r in windows]
    breaches: list[Finding] = down_check(windows, members)
    if (e := error_check("canary", members, windows, limits)) is not None:
        breaches.append(e)
    if (refused := refusal_check(members, [r for r in peer_windows if r not in flagged], windows, limits)) is not None:
        breaches.append(refused)
    qps_drop = p99_rise = None
    thin = True  # too little traffic for the QPS comparison (or nothing to compare)
    short = seconds < limits.qps_window_min_s
    context: list[str] = []
    if members and reference.replicas:
        drop, qps = qps_check("canary", members, windows, seconds, reference, limits, alpha,
                              _dispersion([windows[r] for r in outside_ids if r not in flagged]))  # fmt: skip
        thin = drop is None
        if not short:
            qps_drop = drop
            breaches += [qps] if qps is not None else []
        elif drop is not None:  # the router's split, not the replicas': shown, not judged
            context.append(
                f"canary QPS per replica {-drop:+.0%} against its baseline, not judged: the {seconds:.1f} s window is "
                f"shorter than {limits.qps_window_min_s:g} s, what the router's load polls need to average out "
                "(power_of_two ranks workers by the loads it polled last)"
            )
        p99_rise, p99 = p99_check(
            "canary", members, windows, reference.p99_s, limits, alpha, reference.median_s, reference.timed_requests
        )
        breaches += [p99] if p99 is not None else []
    canary_stats = group_stats({r: windows[r] for r in members}, seconds)

    # Router-wide: client errors no replica's failures explain; traffic too thin to judge; weather alike.
    failures = sum(w.failures for w in windows.values())
    if fleet.client_error_rate > limits.max_error_rate and failures == 0:
        outside.append(
            Finding(
                "clients",
                (),
                f"clients got {fleet.client_errors:.0f} errors of {fleet.requests:.0f} requests "
                f"({fleet.client_error_rate:.2%}) while no replica failed an upstream attempt: the router, not a replica",
            )
        )
    everyone = group_stats({r: windows[r] for r in outside_ids if r not in flagged}, seconds)  # the weather
    # The traffic: every replica up, the canary with them, as the pre-rollout baseline measured every replica. The
    # replicas outside the batch alone are not the fleet's traffic: when the router sends the canary more than its
    # share (power_of_two favours a replica readmitted with no load until its next poll) they see less, and read as
    # a "dip" (issue 28: 4.33 requests/s per replica vs 6.25/s, while clients sent a steady 50/s).
    traffic = group_stats({r: w for r, w in windows.items() if r not in flagged}, seconds)
    thin_traffic = traffic.qps_per_replica * len(members) * seconds < MIN_REQUESTS  # too little for the canary
    if pre is not None and pre.qps_per_replica > 0 and traffic.replicas:
        dip = (pre.qps_per_replica - traffic.qps_per_replica) / pre.qps_per_replica
        expected_then = pre.qps_per_replica * len(members) * seconds
        if thin_traffic and members and expected_then >= MIN_REQUESTS and dip > limits.max_qps_drop:
            words = (
                f"traffic dip: {traffic.qps_per_replica:.2f} requests/s per replica vs {pre.qps_per_replica:.2f}/s "
                f"before the rollout ({dip:.0%} less), too few for the canary to be judged"
            )
            # too little traffic to judge is what --accept-inconclusive accepts, whatever thinned it: said, not paused
            if accept_inconclusive:
                context.append(words + ": passed unjudged by --accept-inconclusive")
            else:
                outside.append(Finding("traffic", (), words))
        elif dip > limits.max_qps_drop:
            context.append(f"traffic per replica {dip:.0%} below the pre-rollout baseline: weather, not the batch")
        if (
            everyone.replicas
            and pre.p99_s
            and everyone.p99_s
            and everyone.p99_s > (1 + limits.max_p99_rise) * pre.p99_s
        ):
            rise = everyone.p99_s / pre.p99_s - 1
            context.append(
                f"the replicas outside the batch are {rise:+.0%} slower (P99) than before the rollout: weather, not the batch"
            )

    inconclusive = _unjudged(members, windows, reference, seconds, limits, thin=thin, p99_judged=p99_rise is not None)
    # Too little traffic is judged on what the canary should get at the fleet's rate in this window, not on what the
    # router happened to send it or its peers: power_of_two can starve a healthy replica for a whole poll. A short
    # soak, or a canary the router starved while traffic was ample, leaves the gates named inconclusive, not paused.
    blind = list(inconclusive) if thin_traffic else []
    undecided: list[Finding] = []
    # The latency gate left unjudged by its baseline while the traffic was ample: the baseline's replicas served
    # enough but their latency was not measured (no histogram series on their /metrics), so nothing bounds the
    # canary's latency and a release twice as slow would pass. Not the traffic's doing: a pause that says so. A
    # baseline that served too little is the thin-traffic case (named, judged on the fleet's traffic, above).
    unmeasured = (
        not thin_traffic
        and "p99_rise" in inconclusive
        and reference.successes >= MIN_REQUESTS > reference.timed_requests
        and canary_stats.timed_requests >= MIN_REQUESTS
    )
    if unmeasured and accept_inconclusive:
        context.append(f"latency not judged, passed by --accept-inconclusive: {inconclusive['p99_rise']}")
    elif unmeasured:
        undecided.append(
            Finding(
                "inconclusive",
                (),
                f"inconclusive, the baseline's latency was not measured: {inconclusive['p99_rise']}. Check that the "
                "baseline's replicas expose their latency histogram on /metrics and resume (the batch is soaked "
                "again), or resume with --accept-inconclusive to pass it unjudged, or roll back",
            )
        )
    if blind and accept_inconclusive:
        context.append(
            "not judged, too little traffic, passed by --accept-inconclusive: "
            + "; ".join(f"{GATE_WORDS[g]}: {inconclusive[g]}" for g in blind)
        )
    elif blind:
        need = _traffic_needed(len(members), len(reference.replicas), len(windows), seconds)
        undecided.append(
            Finding(
                "inconclusive",
                (),
                "inconclusive, too little traffic to judge the canary: "
                + "; ".join(f"{GATE_WORDS[g]}: {inconclusive[g]}" for g in blind)
                + f". The soak needs {need}: send traffic and resume (the batch is soaked again), or resume with "
                "--accept-inconclusive to pass it unjudged, or roll back",
            )
        )

    # The gates in dry run: their findings shown as what they would have done. Not a canary the traffic did not
    # reach while the fleet's was ample (its QPS finding is then the only evidence that the batch serves at all: the
    # error gate has nothing to count), which stays decisive.
    unreached = canary_stats.requests < MIN_REQUESTS and not thin_traffic
    dry = [f for f in (*outside, *breaches) if f.gate in dry_gates and not (f.gate == "qps" and unreached)]
    context += [
        f"dry run, not enforced (rollout.dry_run_gates): would have {'paused' if f in outside else 'rolled back'}: "
        + f.text
        for f in dry
    ]
    outside = [f for f in outside if f not in dry]
    breaches = [f for f in breaches if f not in dry]
    decision: Decision = "pause" if outside or (undecided and not breaches) else "rollback" if breaches else "pass"
    base_words = f"baseline: {BASIS_WORDS[basis]} — {_describe(reference)}"
    canary_words = f"canary {_describe(canary_stats)}"
    if decision == "pause" and not outside:
        head = [f.text for f in undecided]
        named = []
    elif decision == "pause":
        head = ["evidence outside the batch, the new version is not blamed: " + "; ".join(f.text for f in outside)]
        if breaches:
            head.append("the canary also breached, not attributable while the fleet is like this: "
                        + "; ".join(f.text for f in breaches))  # fmt: skip
        head += [f.text for f in undecided]
        named = outside
    elif decision == "rollback":
        head = ["breach confined to the canary: " + "; ".join(f.text for f in breaches)]
        named = breaches
    else:
        head = ["canary within every gate"]
        named = []
    evidence = (*head, canary_words, base_words, *context)
    replicas = tuple(dict.fromkeys(r for f in named for r in f.replicas))
    return Gates(
        qps_drop=qps_drop,
        p99_rise=p99_rise,
        error_rate=canary_stats.error_rate,
        client_error_rate=fleet.client_error_rate,
        upstream_error_rate=fleet.upstream_error_rate,
        retries=fleet.retries,
        breaches=tuple(f.text for f in (*outside, *breaches, *undecided)),
        canary=canary_stats,
        baseline=reference,
        verdict=Verdict(decision, basis, evidence, replicas),
        inconclusive=inconclusive,
    )


GATE_WORDS: Mapping[str, str] = {"qps_drop": "QPS", "p99_rise": "P99", "error_rate": "error rate"}


def _unjudged(
    members: Sequence[str],
    windows: Mapping[str, ReplicaWindow],
    reference: GroupStats,
    seconds: float,
    limits: GateLimits,
    *,
    thin: bool,
    p99_judged: bool,
) -> dict[str, str]:
    """Why each of the canary's gates (the keys of :meth:`Gates.contract`) was not judged; empty when all were.
    QPS and P99 need :data:`MIN_REQUESTS` (see :func:`qps_check`, :func:`p99_check`); so does the error rate: no
    failure among a handful of attempts says little of a 0.1 % limit."""
    if not members:
        return {}
    out: dict[str, str] = {}
    if thin:
        expected = reference.qps_per_replica * len(members) * seconds
        out["qps_drop"] = (
            "no replica beside the canary to compare with"
            if not reference.replicas
            else f"{expected:.0f} successes expected of the canary at its baseline's "
            f"{reference.qps_per_replica:.2f} req/s per replica, {reference.successes:.0f} served by the baseline; "
            f"the test needs {MIN_REQUESTS} of each"
        )
    elif seconds < limits.qps_window_min_s:
        out["qps_drop"] = (
            f"the {seconds:.1f} s soak is shorter than {limits.qps_window_min_s:g} s, the router load polls the QPS "
            "split needs to average out (rollout.interval_s)"
        )
    if not p99_judged:
        latency = merge_histograms(windows[r].latency for r in members)
        timed = latency.count if latency is not None else 0.0
        if timed < MIN_REQUESTS:
            out["p99_rise"] = f"{timed:.0f} of the canary's requests timed; the test needs {MIN_REQUESTS}"
        elif reference.p99_s is None:
            out["p99_rise"] = "the baseline timed no request: no P99 to compare with"
        else:
            out["p99_rise"] = (
                f"{reference.timed_requests:.0f} of the baseline's requests timed; the test needs {MIN_REQUESTS} "
                "(a quantile of fewer is no reference)"
            )
    attempts = sum(windows[r].requests for r in members)
    if attempts < MIN_REQUESTS:
        out["error_rate"] = f"{attempts:.0f} upstream attempts reached the canary; its error rate needs {MIN_REQUESTS}"
    return out


def traffic_needed(canary: int, replicas: int, seconds: float) -> tuple[float, float]:
    """Requests per second per replica, and through the routers for ``replicas`` replicas, that give a canary of
    ``canary`` replicas :data:`MIN_REQUESTS` over ``seconds`` — what its gates need to be judged."""
    per = MIN_REQUESTS / (max(1, canary) * seconds) if seconds > 0 else math.inf
    return per, per * replicas


def _traffic_needed(canary: int, baseline: int, replicas: int, seconds: float) -> str:
    per, total = traffic_needed(min(canary, baseline or canary), replicas, seconds)
    return f"at least {per:.2f} req/s per replica ({total:.1f} req/s through the routers) over its {seconds:.1f} s"


def _dispersion(windows: Sequence[ReplicaWindow]) -> float:
    """Variance over mean of the per-replica success counts of every replica outside the canary that is up (the
    same router split them in the same window), at least 1 (Poisson); 1 with fewer than 3 replicas."""
    counts = [w.successes for w in windows]
    if len(counts) < 3:
        return 1.0
    mean = sum(counts) / len(counts)
    variance = sum((c - mean) ** 2 for c in counts) / (len(counts) - 1)
    return max(1.0, variance / mean) if mean > 0 else 1.0


def _describe(g: GroupStats) -> str:
    p99 = "n/a" if g.p99_s is None else f"{g.p99_s * 1000:.1f} ms"
    left = f", left out: {', '.join(f'{r} ({why})' for r, why in g.excluded.items())}" if g.excluded else ""
    return (
        f"{len(g.replicas)} replicas ({', '.join(g.replicas[:4])}{', …' if len(g.replicas) > 4 else ''}): "
        f"{g.qps_per_replica:.2f} req/s per replica, P99 {p99}, errors {g.errors:.0f}/{g.requests:.0f}{left}"
    )


def canary_budget_spent(
    canary: Sequence[str],
    peers: Sequence[str],
    windows: Mapping[str, ReplicaWindow],
    expected_attempts: float,
    limits: GateLimits,
) -> bool:
    """True once the canary's upstream failures exceed what the whole soak may hold (0.1 % of the attempts it
    should get over the interval at pre-rollout traffic, or of those it already got) while its peers stay
    within the limit: the interval's error gate is decided, so the soak judges the window so far and ends on a
    rollback verdict (it soaks on when that window holds evidence outside the batch, such as a traffic dip that
    leaves it too thin to judge).
    (A single early error in a large window does not end the soak: the budget is for the interval.)"""
    failures = sum(windows[r].failures for r in canary if r in windows)
    attempts = sum(windows[r].requests for r in canary if r in windows)
    peer_failures = sum(windows[r].failures for r in peers if r in windows)
    peer_attempts = sum(windows[r].requests for r in peers if r in windows)
    confined = peer_failures <= limits.max_error_rate * peer_attempts
    return confined and failures > limits.max_error_rate * max(expected_attempts, attempts)
