"""promtool unit tests for ``ExaServeWorkersUnhealthy`` with one ``smg_worker_health`` series per worker.

The alert counts the healthy series of each router instance; a static test file cannot hold the 2,048 series per
instance that the prod plan's figures need, so these tests are built here from the plan (its workers, its largest
rollout batch, the healthy minimum the rule renders) and appended to ``tests/promtool/exaserve.serving.test.yaml``
before ``promtool test rules`` runs. Stale series are what a router leaves behind a removed worker: ``-1`` in
sglang-router 0.3.2 (kept after ``DELETE /workers/{id}``, seen 125 s later), ``0`` in smg 1.13 while one drains.
"""

from __future__ import annotations

from typing import Any

from serving.plan.model import Fleet
from serving.render.k8s.monitoring import min_healthy_workers
from serving.rollout.backends.kubernetes import batch_lease_name

ALERT = "ExaServeWorkersUnhealthy"
ROUTERS = ("sglang-router-a", "sglang-router-b")
_STEPS = 30  # one sample a minute: the rule's 5 m `for` is met by the 20 m evaluation
# promtool's unit-test engine refuses a query over about 3,300 series here (promtool 2.42: 3,000 pass, 4,096 fail with
# "query processing would load too many samples"), so one router instance carries each case, and after a full rollout
# the last two batches' old series stand for the stale ones (the sum of the old rule fires with any 205 of them).


def _series(pod: str, worker: str, value: int) -> dict[str, str]:
    labels = f'namespace="exaserve",service="sglang-router",pod="{pod}",worker="http://{worker}:30000"'
    return {"series": f"smg_worker_health{{{labels}}}", "values": f"{value}x{_STEPS}"}


def _addresses(prefix: int, n: int) -> list[str]:
    """``n`` distinct worker addresses; a new ``prefix`` is where replaced pods come back."""
    return [f"10.{prefix}.{i // 250}.{i % 250}" for i in range(n)]


def _lease(renewed: str, fleet: Fleet) -> dict[str, str]:
    """kube-state-metrics' ``kube_lease_renew_time`` of the updater's batch Lease: ``renewed`` is promtool's values
    notation (``0+60x30``: renewed every minute, so fresh at every evaluation; ``300x30``: last renewed at 5 m)."""
    name = batch_lease_name(fleet.spec.kubernetes.namespace)
    return {"series": f'kube_lease_renew_time{{job="kube-state-metrics",lease="{name}"}}', "values": renewed}


def _test(
    name: str,
    per_router: dict[str, list[tuple[str, int]]],
    fires: bool,
    fleet: Fleet,
    lease: str | None = None,
) -> dict[str, Any]:
    workers, healthy_min = sum(fleet.plan.rollout_group_sizes), min_healthy_workers(fleet)
    batch = max(fleet.plan.rollout_group_sizes)
    expected: list[dict[str, Any]] = []
    if fires:
        expected = [
            {
                "exp_labels": {"severity": "critical"},
                "exp_annotations": {
                    "summary": f"Fewer than {healthy_min} of the plan's {workers} workers are healthy (a rollout batch "
                    f"the updater announces, up to {batch}, counts as healthy): the "
                    f"{fleet.spec.limits.failure_reserve:.0%} failure reserve is used up.",
                    "fix": "Find the missing workers (kubectl get pods -l app.kubernetes.io/name=sglang: Pending, "
                    "Init, CrashLoopBackOff) and their nodes (exaserve.io/rack labels); run the preflight playbook.",
                },
            }
        ]
    return {
        "name": name,
        "interval": "1m",
        "input_series": [_series(pod, w, v) for pod, series in per_router.items() for w, v in series]
        + ([_lease(lease, fleet)] if lease is not None else []),
        "alert_rule_test": [{"eval_time": "20m", "alertname": ALERT, "exp_alerts": expected}],
    }


def worker_health_tests(fleet: Fleet) -> list[dict[str, Any]]:
    """A router sees every worker (one router instance, see above). Quiet: the whole fleet healthy beside a batch's stale series (a rollout batch
    back on new addresses) or beside the whole fleet's (after a full rollout), and exactly the healthy minimum.
    Firing: one worker under the minimum healthy (the rest at 0, draining), and one router with no healthy worker.
    A rollout batch out: quiet while the updater renews its batch Lease, firing without it, with a Lease that
    stopped being renewed, or with more than the reserve lost beside the batch."""
    workers, healthy_min = sum(fleet.plan.rollout_group_sizes), min_healthy_workers(fleet)
    batch = max(fleet.plan.rollout_group_sizes)
    new, old = _addresses(1, workers), _addresses(0, workers)

    def every(series: list[tuple[str, int]]) -> dict[str, list[tuple[str, int]]]:
        return {ROUTERS[0]: series}

    healthy = [(w, 1) for w in new]
    return [
        _test(
            f"a rollout batch of {batch} back on new addresses, their old series stale at -1 -> quiet",
            every([*healthy, *((w, -1) for w in old[:batch])]),
            fires=False,
            fleet=fleet,
        ),
        _test(
            f"after a full rollout: {workers} healthy, the last two batches' old series stale at -1 -> quiet",
            every([*healthy, *((w, -1) for w in old[: 2 * batch])]),
            fires=False,
            fleet=fleet,
        ),
        _test(
            f"exactly {healthy_min} healthy, the rest draining at 0 -> quiet",
            every([(w, 1 if i < healthy_min else 0) for i, w in enumerate(new)]),
            fires=False,
            fleet=fleet,
        ),
        _test(
            f"{healthy_min - 1} healthy, the rest draining at 0 -> fires",
            every([(w, 1 if i < healthy_min - 1 else 0) for i, w in enumerate(new)]),
            fires=True,
            fleet=fleet,
        ),
        _test(
            "one router sees every worker healthy, the other its only worker unhealthy -> fires",
            {ROUTERS[0]: healthy, ROUTERS[1]: [(new[0], 0)]},
            fires=True,
            fleet=fleet,
        ),
        # issue 39: a rollout batch out of rotation by plan (discovery dropped its workers) pages only when nobody
        # announces it, or its announcer died
        _test(
            f"a rollout batch of {batch} out, the updater renewing its batch Lease -> quiet",
            every(healthy[batch:]),
            fires=False,
            fleet=fleet,
            lease="0+60x30",
        ),
        _test(
            f"a batch of {batch} out and no batch Lease (nobody rolling: a real loss) -> fires",
            every(healthy[batch:]),
            fires=True,
            fleet=fleet,
        ),
        _test(
            f"a batch of {batch} out, its Lease last renewed at 5 m (the updater died with the batch out) -> fires",
            every(healthy[batch:]),
            fires=True,
            fleet=fleet,
            lease="300x30",
        ),
        _test(
            f"a batch of {batch} out and announced, and the reserve's {workers - healthy_min} + 1 lost beside it "
            "-> fires",
            every(healthy[batch + workers - healthy_min + 1 :]),
            fires=True,
            fleet=fleet,
            lease="0+60x30",
        ),
        _test(
            f"a batch of {batch} out and announced, and the whole reserve of {workers - healthy_min} lost beside it "
            "-> quiet",
            every(healthy[batch + workers - healthy_min :]),
            fires=False,
            fleet=fleet,
            lease="0+60x30",
        ),
    ]
