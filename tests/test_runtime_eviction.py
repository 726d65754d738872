"""Issue 24, finding 4: on Kubernetes the controller restarts a migrated replica by evicting its pod.

Before, the controllers ran with ``--backend none``: every migration failed (90 in a row against one pod hung for
150 s) and ``ExaServeRuntimeActionsFailing`` fired. Now :class:`PodEvictionRestarter` evicts the pod through the
``policy/v1`` Eviction API, authorized by the controller's rendered Role alone, and waits for its StatefulSet to
create it again. The API server is the stand-in of ``tests/support/apiserver.py`` (there is none here), which judges
an eviction against the rendered PodDisruptionBudgets the way ``eviction.go`` does.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from aiohttp import web

from serving.kubeapi import KubeApi
from serving.render.k8s import runtime
from serving.rollout.backends import BackendError
from serving.runtime.eviction import PodEvictionRestarter, RestartRefused
from serving.spec.schema import FleetSpec
from tests.support.apiserver import AuthorizingApiServer, k8s_spec
from tests.support.stacks import fleet_of

SPEC: FleetSpec = k8s_spec(False)
NS = SPEC.kubernetes.namespace


def controller_role(spec: FleetSpec) -> dict[str, Any]:
    roles = [o for o in runtime.render(fleet_of(spec)) if o["kind"] == "Role"]
    return next(dict(r) for r in roles if r["metadata"]["name"] == runtime.CONTROLLER_ROLE)


def restart(api: AuthorizingApiServer, pod: str, timeout_s: float = 5) -> None:
    async def go() -> None:
        restarter = PodEvictionRestarter(KubeApi(api.url), NS, poll_s=0.02)
        try:
            await restarter.restart(pod, timeout_s)
        finally:
            await restarter.aclose()

    asyncio.run(go())


def unready(api: AuthorizingApiServer, *pods: str) -> None:
    """The pods fail their readiness probe (a hung SGLang, a pod still loading)."""
    for name in pods:
        api.pods[name]["status"]["conditions"] = [{"type": "Ready", "status": "False"}]


def group_pods(api: AuthorizingApiServer, group: int) -> list[str]:
    return sorted((n for n in api.pods if n.startswith(f"sglang-g{group}-")), key=lambda n: int(n.rsplit("-", 1)[1]))


def budget_of(api: AuthorizingApiServer, group: int) -> dict[str, Any]:
    return api.budgets[f"sglang-g{group}"]


def test_a_migration_evicts_the_pod_with_the_controllers_role_and_waits_for_its_successor() -> None:
    api = AuthorizingApiServer(SPEC, controller_role(SPEC))
    with api:
        pod = group_pods(api, 1)[0]
        old_uid = api.pods[pod]["metadata"]["uid"]
        restart(api, pod)
        assert api.evicted == [pod] == api.deleted
        # not before the evicted pod finished terminating: a new pod of the same name, from the StatefulSet
        assert api.pods[pod]["metadata"]["uid"] != old_uid and "deletionTimestamp" not in api.pods[pod]["metadata"]
    assert [d for d in api.decisions if not d[-1]] == []
    used = {(verb, resource) for verb, _, resource, _, _ in api.decisions}
    assert used == {("get", "pods"), ("create", "pods/eviction")}


def test_a_role_without_the_eviction_grant_fails_the_restart_with_the_api_servers_403() -> None:
    role = copy.deepcopy(controller_role(SPEC))
    role["rules"] = [r for r in role["rules"] if r["resources"] != ["pods/eviction"]]
    api = AuthorizingApiServer(SPEC, role)
    with api, pytest.raises(BackendError, match=r"evicting pod exaserve/sglang-g1-0: HTTP 403"):
        restart(api, "sglang-g1-0")
    assert api.evicted == []


def test_the_controller_may_evict_no_pod_but_the_serving_ones() -> None:
    """The Role names the serving pods: the controller cannot evict its peers, an agent, or a router."""
    api = AuthorizingApiServer(SPEC, controller_role(SPEC))
    with api, pytest.raises(BackendError, match=r"exaserve/exaserve-controller-7d9f-x2x4z: HTTP 403"):
        restart(api, "exaserve-controller-7d9f-x2x4z")
    assert [d[-1] for d in api.decisions] == [False]


def test_a_ready_pod_is_not_evicted_while_its_group_has_spent_its_budget() -> None:
    """maxUnavailable pods of the group already not Ready: evicting a Ready one would break the budget, and the API
    server answers 429; the restart is *refused* (the controller backs off, no quarantine) naming the budget."""
    api = AuthorizingApiServer(SPEC, controller_role(SPEC))
    with api:
        pods = group_pods(api, 1)
        spent = int(budget_of(api, 1)["spec"]["maxUnavailable"])
        unready(api, *pods[:spent])
        with pytest.raises(RestartRefused) as refused:
            restart(api, pods[-1])
        assert api.evicted == [] and api.pods[pods[-1]]["status"]["conditions"][0]["status"] == "True"
    message = str(refused.value)
    assert "Cannot evict pod as it would violate the pod's disruption budget." in message
    assert (
        f"The disruption budget sglang-g1 needs {len(pods) - spent} healthy pods and has {len(pods) - spent}" in message
    )
    assert "kubectl get pdb" in message


def test_a_hung_pod_is_evicted_even_when_its_group_is_short_of_pods() -> None:
    """The replica the controller migrates is itself not Ready. The rendered budgets say AlwaysAllow, so it goes
    even when its group has spent its budget; under the default IfHealthyBudget the same eviction is refused: the
    hung pod would pin itself (eviction.go)."""
    api = AuthorizingApiServer(SPEC, controller_role(SPEC))
    with api:
        pods = group_pods(api, 1)
        spent = int(budget_of(api, 1)["spec"]["maxUnavailable"])
        assert budget_of(api, 1)["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
        unready(api, *pods[: spent + 1])
        restart(api, pods[spent])
        assert api.evicted == [pods[spent]]
        unready(api, pods[spent])  # its successor loads: the group is one short of its budget again
        del budget_of(api, 1)["spec"]["unhealthyPodEvictionPolicy"]
        with pytest.raises(RestartRefused, match="needs"):
            restart(api, pods[0])


class ReplacedBeforeTheEviction(AuthorizingApiServer):
    """The pod is replaced (a new UID, Ready) between the restarter's read and its eviction, while its group has
    spent its budget: the API server judges the budget before the UID precondition (eviction.go), so it answers 429
    for a pod the restarter never meant to evict."""

    async def _evict(self, request: web.Request) -> web.Response:
        name = request.path.removesuffix("/eviction").rsplit("/", 1)[1]
        self.pods[name]["metadata"]["uid"] = "replaced"
        unready(
            self, *[p for p in group_pods(self, 1) if p != name][: int(budget_of(self, 1)["spec"]["maxUnavailable"])]
        )
        return await super()._evict(request)


def test_a_pod_replaced_since_it_was_read_is_a_restart_done_not_refused() -> None:
    api = ReplacedBeforeTheEviction(SPEC, controller_role(SPEC))
    with api:
        pod = group_pods(api, 1)[0]
        restart(api, pod)  # 429 for the new pod: no RestartRefused, it is the restart the controller wanted
        assert api.evicted == [] and api.pods[pod]["metadata"]["uid"] == "replaced"


def test_a_pod_already_gone_is_waited_for_and_a_pod_never_recreated_times_out_naming_it() -> None:
    api = AuthorizingApiServer(SPEC, controller_role(SPEC))
    with api:
        pod = group_pods(api, 2)[0]
        api.pods.pop(pod)  # deleted by someone else; its StatefulSet has not created it again (and will not here)
        with pytest.raises(
            BackendError, match=rf"pod exaserve/{pod} was gone before the restart and after 0.3 s is not"
        ):
            restart(api, pod, timeout_s=0.3)
        assert api.evicted == []
