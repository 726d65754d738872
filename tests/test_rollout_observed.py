"""The fleet is the truth, the journal a log: the pure planning from observed versions
(:func:`serving.rollout.session.plan_from_fleet`), the journal's own account of the fleet, and how each backend
reads what a replica runs from what runs it (systemd's ``show`` output, a pod object).

Pure functions over specs, plans and objects; the end-to-end checks with the real router and real worker processes
are in ``tests/test_rollout_fleet_truth.py``.
"""

from __future__ import annotations

import asyncio
import copy
import json
from dataclasses import replace
from typing import Any

import pytest

from serving.kubeapi import KubeApi
from serving.plan.model import Plan
from serving.render.k8s.fleet import SERVING_CONTAINER, group_name, pod_template
from serving.rollout.backends.kubernetes import KubernetesBackend, pod_version
from serving.rollout.backends.ssh import parse_show
from serving.rollout.machine import Outcome, RolloutState, initial
from serving.rollout.plan import RolloutPlan, plan_rollout
from serving.rollout.session import FleetView, RolloutInputError, Scope, journal_versions, plan_from_fleet
from serving.spec.schema import FleetSpec
from tests.support.apiserver import ApiServerStandIn, k8s_spec
from tests.support.stacks import fleet_of, spec_from

SANDBOX = spec_from("sandbox")
RELEASES = {
    "v1": "lmsysorg/sglang:v0.5.23-cu126",
    "v2": "lmsysorg/sglang:v0.5.24-cu126",
    "v2-hotfix": "lmsysorg/sglang:v0.5.24-cu126",  # same image as v2: only the version label tells them apart
}
K8S = spec_from("dev", serving__releases=RELEASES)


def ids(spec: FleetSpec) -> list[str]:
    return [r.id for r in fleet_of(spec).plan.replicas]


def completed(spec: FleetSpec, frm: str, to: str, observed: dict[str, str | None] | None = None) -> RolloutState:
    """The journal's state after a completed rollout ``frm`` → ``to`` over every replica."""
    p = plan_rollout(fleet_of(spec, "s"), from_version=frm, to_version=to, observed=observed)
    state = initial(p)
    batches = tuple(replace(b, version=to, passed=True) for b in state.batches)
    return replace(state, step=None, outcome=Outcome.COMPLETED, batches=batches)


def scope_of(
    spec: FleetSpec, observed: dict[str, str | None], to: str, latest: RolloutState | None = None, **kw: Any
) -> Scope:
    return plan_from_fleet(fleet_of(spec, "s"), FleetView(observed, journal_versions(latest)), to, **kw)


# ----------------------------------------------------------------------------------------- planning


def test_a_fleet_recreated_behind_a_completed_journal_is_planned_from_what_it_runs() -> None:
    every = ids(SANDBOX)
    behind = [every[1], every[4], every[6]]
    observed: dict[str, str | None] = {r: "v1" if r in behind else "v2" for r in every}
    scope = scope_of(SANDBOX, observed, "v2", completed(SANDBOX, "v1", "v2"))
    assert scope.plan is not None, "journal says v2 everywhere, 3 replicas run v1: not 'nothing to do'"
    assert sorted(scope.plan.replicas) == sorted(behind)
    assert (scope.plan.from_version, scope.plan.to_version) == ("v1", "v2")
    assert [b.index for b in scope.plan.batches] == list(range(len(scope.plan.batches)))
    assert all(b.replicas for b in scope.plan.batches)
    assert scope.report() == {
        "journal_disagreements": [{"replica": r, "journal": "v2", "observed": "v1"} for r in every if r in behind],
        "held": {},
    }
    assert scope.plan.observed == observed  # the journal's plan line records the fleet it started from
    assert "the journal disagrees with the fleet on 3 replicas (3 say v2, run v1)" in "\n".join(scope.notes())


def test_every_replica_recreated_on_the_old_version_plans_every_batch() -> None:
    every = ids(SANDBOX)
    scope = scope_of(SANDBOX, dict.fromkeys(every, "v1"), "v2", completed(SANDBOX, "v1", "v2"))
    assert scope.plan is not None and sorted(scope.plan.replicas) == sorted(every)
    assert len(scope.plan.batches) == SANDBOX.rollout.batches
    assert len(scope.report()["journal_disagreements"]) == len(every)


def test_a_fleet_on_the_target_is_nothing_to_do_and_agrees_with_the_journal() -> None:
    every = ids(SANDBOX)
    scope = scope_of(SANDBOX, dict.fromkeys(every, "v2"), "v2", completed(SANDBOX, "v1", "v2"))
    assert scope.plan is None
    assert scope.report() == {"journal_disagreements": [], "held": {}}


def test_a_down_replica_refuses_the_start_naming_it_and_the_fix() -> None:
    every = ids(SANDBOX)
    observed: dict[str, str | None] = {**dict.fromkeys(every, "v1"), every[2]: None}
    with pytest.raises(RolloutInputError) as err:
        scope_of(SANDBOX, observed, "v2")
    message = str(err.value)
    assert f"1 of {len(every)} replicas are down or unreachable: {every[2]}" in message
    assert "exaserve sandbox up" in message and "--allow-degraded" in message


def test_allow_degraded_holds_the_down_replica_and_plans_the_rest() -> None:
    every = ids(SANDBOX)
    observed: dict[str, str | None] = {**dict.fromkeys(every, "v1"), every[2]: None}
    scope = scope_of(SANDBOX, observed, "v2", allow_degraded=True)
    assert scope.plan is not None
    assert sorted(scope.plan.replicas) == sorted(r for r in every if r != every[2])
    assert scope.held == {every[2]: "down"}
    assert scope.view.final_versions()[every[2]] == "down"


def test_whole_groups_plan_a_group_with_any_replica_behind_and_hold_a_group_with_one_down() -> None:
    """On Kubernetes an update patches a whole workload: the plan keeps groups whole."""
    p: Plan = fleet_of(K8S).plan
    group = {r.id: r.group for r in p.replicas}
    g1 = [r for r in group if group[r] == 1]
    g2 = [r for r in group if group[r] == 2]
    observed: dict[str, str | None] = {r: "v2" for r in group}
    observed |= {g1[0]: "v1", g2[0]: "v1", g2[1]: None}
    with pytest.raises(RolloutInputError, match="their update groups are held whole"):
        scope_of(K8S, observed, "v2", whole_groups=True)
    scope = scope_of(K8S, observed, "v2", whole_groups=True, allow_degraded=True)
    assert scope.plan is not None and sorted(scope.plan.replicas) == sorted(g1)
    assert scope.held[g2[1]] == "down"
    assert set(scope.held) == set(g2) and "down" in scope.held[g2[0]]
    # The same fleet on a per-replica backend: only the replica behind, the down one held alone.
    per_replica = scope_of(K8S, observed, "v2", allow_degraded=True)
    assert per_replica.plan is not None and sorted(per_replica.plan.replicas) == sorted([g1[0], g2[0]])
    assert per_replica.held == {g2[1]: "down"}


def test_replicas_behind_on_two_versions_refuse_a_gated_rollout_but_not_a_revert() -> None:
    every = ids(SANDBOX)
    observed: dict[str, str | None] = {**dict.fromkeys(every, "v2"), every[0]: "v1", every[3]: "v2-slow"}
    with pytest.raises(RolloutInputError) as err:
        scope_of(SANDBOX, observed, "v2-broken")
    assert "run 3 versions" in str(err.value) and "exaserve rollout --to v2" in str(err.value)
    revert = scope_of(SANDBOX, observed, "v1", kind="revert")
    assert revert.plan is not None and revert.plan.from_version == "v2+v2-slow"
    assert every[0] not in revert.plan.replicas and len(revert.plan.replicas) == len(every) - 1


def test_a_replica_on_no_release_of_the_stack_refuses_a_gated_rollout() -> None:
    every = ids(K8S)
    odd = "unknown (image lmsysorg/sglang:v0.5.9-cu126, version label v1)"
    observed: dict[str, str | None] = {**dict.fromkeys(every, "v2"), every[5]: odd}
    with pytest.raises(RolloutInputError, match=r"which is no release of serving.releases.*pulumi up"):
        scope_of(K8S, observed, "v2")


def test_the_journal_accounts_for_replicas_it_did_not_plan_and_round_trips_through_json() -> None:
    every = ids(SANDBOX)
    observed: dict[str, str | None] = {**dict.fromkeys(every, "v2"), every[0]: "v1", every[1]: None}
    scope = scope_of(SANDBOX, observed, "v2", allow_degraded=True)
    assert scope.plan is not None and scope.plan.replicas == (every[0],)
    again = RolloutPlan.from_json(json.loads(json.dumps(scope.plan.to_json())))
    assert again == scope.plan
    state = initial(again)
    done = replace(state, step=None, outcome=Outcome.COMPLETED, batches=(replace(state.batches[0], version="v2"),))
    told = journal_versions(done)
    assert told == {**dict.fromkeys(every, "v2"), every[1]: None}  # the held one: down when it last looked
    # The replica comes back on v1: a disagreement with the journal, planned on the next rollout to v2.
    later = scope_of(SANDBOX, {**dict.fromkeys(every, "v2"), every[1]: "v1"}, "v2", done)
    assert later.plan is not None and later.plan.replicas == (every[1],)
    assert later.report()["journal_disagreements"] == [{"replica": every[1], "journal": "down", "observed": "v1"}]


def test_a_journal_written_before_observations_falls_back_to_its_from_version() -> None:
    p = plan_rollout(fleet_of(SANDBOX, "s"), from_version="v1", to_version="v2")
    doc = p.to_json()
    del doc["observed"]
    old = RolloutPlan.from_json(doc)
    assert set(journal_versions(initial(old)).values()) == {"v1"}


# ----------------------------------------------------------------------------------------- SSH: systemd


def test_parse_show_reports_a_unit_that_is_not_active_as_down() -> None:
    text = (
        "Id=a.service\nActiveState=active\nEnvironment=EXASERVE_RELEASE=v2\n\n"
        "Id=b.service\nActiveState=failed\nEnvironment=EXASERVE_RELEASE=v2\n\n"
        "Id=c.service\nActiveState=activating\nEnvironment=EXASERVE_RELEASE=v1\n"
    )
    assert parse_show(text) == {"a.service": "v2", "b.service": None, "c.service": None}


# ----------------------------------------------------------------------------------------- Kubernetes: pods


def pod(spec: FleetSpec, group: int, ordinal: int, **status: Any) -> dict[str, Any]:
    """The leader pod ``sglang-g<group>-<ordinal>`` the LeaderWorkerSet controller creates from the rendered
    template, running (``status`` overrides)."""
    template = copy.deepcopy(pod_template(fleet_of(spec), group, 1))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template["metadata"], "name": f"{group_name(group)}-{ordinal}"},
        "spec": template["spec"],
        "status": {
            "phase": "Running",
            "containerStatuses": [{"name": SERVING_CONTAINER, "ready": True, "state": {"running": {}}}],
            **status,
        },
    }


def test_pod_version_reads_the_template_label_checked_against_the_image() -> None:
    assert pod_version(K8S, pod(K8S, 0, 0)) == "v1"
    hotfix = spec_from("dev", serving__releases=RELEASES, rollout__group_versions={0: "v2-hotfix"})
    assert pod_version(K8S, pod(hotfix, 0, 0)) == "v2-hotfix", "v2 and v2-hotfix share an image: the label decides"
    edited = pod(K8S, 0, 0)
    edited["spec"]["containers"][0]["image"] = "lmsysorg/sglang:v0.5.9-cu126"  # kubectl set image, by hand
    assert pod_version(K8S, edited) == "unknown (image lmsysorg/sglang:v0.5.9-cu126, version label v1)"


@pytest.mark.parametrize(
    "status",
    [
        {"phase": "Pending", "containerStatuses": []},
        {"containerStatuses": [{"name": SERVING_CONTAINER, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]},
        {"phase": "Failed"},
    ],
    ids=["pending", "crash-looping", "failed"],
)
def test_a_pod_that_is_not_running_is_down(status: dict[str, Any]) -> None:
    assert pod_version(K8S, pod(K8S, 0, 0, **status)) is None


def test_a_terminating_pod_is_down_and_readiness_is_not_asked() -> None:
    terminating = pod(K8S, 0, 0)
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert pod_version(K8S, terminating) is None
    held = pod(K8S, 0, 0, conditions=[{"type": "Ready", "status": "False"}])  # readiness held by the updater
    held["status"]["containerStatuses"][0]["ready"] = False
    assert pod_version(K8S, held) == "v1"


@pytest.mark.parametrize("multi", [False, True], ids=["one-node-replicas", "two-node-replicas"])
def test_kubernetes_versions_read_every_pod_not_the_workload(multi: bool) -> None:
    """Against the API-server STAND-IN of tests/test_rollout_backends.py (no API server here): the workload says one
    thing, the pods another after the fleet changed behind it; versions() reports the pods."""
    spec = k8s_spec(multi)
    fl = fleet_of(spec)
    p = fl.plan
    backend_ids = {r.id: r for r in p.replicas}
    every = list(backend_ids)
    g1 = [r for r in every if backend_ids[r].group == 1]
    with ApiServerStandIn(spec) as api:
        backend = KubernetesBackend(fl, KubeApi(api.url))

        async def scenario() -> tuple[dict[str, str | None], dict[str, str | None], dict[str, str | None]]:
            try:
                before = await backend.versions(every)
                await backend.update(g1, "v2", timeout_s=10)
                after = await backend.versions(every)
                # Behind the updater: a pod of group 1 is lost (its last pod: the worker of a two-node replica), a
                # replica of group 2 gets another image by hand, a pod of group 0 crash-loops.
                lost = sorted(n for n in api.pods if n.startswith(f"{group_name(1)}-0"))[-1]
                del api.pods[lost]
                replica = f"{group_name(2)}-0"
                for name in [n for n in api.pods if n == replica or n.startswith(replica + "-")]:
                    api.pods[name]["spec"]["containers"][0]["image"] = "lmsysorg/sglang:v0.5.9-cu126"
                crashing = api.pods[f"{group_name(0)}-1"]
                crashing["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
                return before, after, await backend.versions(every)
            finally:
                await backend.aclose()

        before, after, changed = asyncio.run(scenario())
    assert set(before.values()) == {"v1"}
    assert after == {r: "v2" if r in g1 else "v1" for r in every}
    ordinal0 = {g: next(r for r in every if backend_ids[r].group == g) for g in (1, 2)}  # ordinal 0: lowest index
    by_pod = {1: ordinal0[1], 2: ordinal0[2], 0: sorted((r for r in every if backend_ids[r].group == 0),
                                                       key=lambda r: backend_ids[r].index)[1]}  # fmt: skip
    assert changed[by_pod[1]] is None and changed[by_pod[0]] is None
    assert changed[by_pod[2]] == "unknown (image lmsysorg/sglang:v0.5.9-cu126, version label v1)"
    assert {r: v for r, v in changed.items() if r not in by_pod.values()} == {
        r: after[r] for r in every if r not in by_pod.values()
    }
