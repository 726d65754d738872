"""Stack rules on what the project's pods may do to the API server and the nodes: every Role and binding held to an
allowlist of exactly the calls its account's code makes (``rbac-allowlist``), and no pod sharing a host namespace
or mounting a service-account token it never uses (``pod-host-isolation``).

The allowlist is written from the code that uses each account, not from the render (a guard that compared the
render with itself would pass whatever the render grows). Each grant names the call that needs it:

* the updater (:mod:`serving.rollout.backends.kubernetes`): ``GET``/``PATCH`` of a group's workload by name,
  ``GET pods?labelSelector=`` (``list``), ``PATCH`` of a replica's serving pod (its admitted label) and, for
  StatefulSet groups, its ``DELETE``, each by name; the rollout announcement on one ``coordination.k8s.io`` Lease
  :func:`~serving.rollout.backends.kubernetes.batch_lease_name` (``create``, which RBAC cannot narrow by name, then
  ``get``/``update`` by name: it resigns the Lease, never deletes it);
* the controller: its election Lease (:mod:`serving.runtime.leader`: ``GET``/``PUT`` by name, ``POST`` to create)
  and the restart of a replica (:mod:`serving.runtime.eviction`: ``GET`` of the pod and ``POST`` of its
  ``pods/eviction``, by name; never ``delete``, which a PodDisruptionBudget does not hold back);
* the node agent (:mod:`serving.runtime.discovery`): ``list`` of pods (by label and node); ``get`` is rendered too
  and grants nothing ``list`` does not (a list returns whole pods);
* the router's service discovery (smg ``--service-discovery``): ``get``/``list``/``watch`` on pods.

RBAC adds rules up (kubernetes ``plugin/pkg/auth/authorizer/rbac/rbac.go``, ``RulesAllow``): one extra rule is a
new power, whatever the others say. A wildcard, a subresource (``pods/exec``, ``pods/ephemeralcontainers``), a verb
or a name outside the allowlist is refused; so is a Role the allowlist does not know, any ClusterRole or
ClusterRoleBinding, and a RoleBinding that binds anything but its own account to its own Role. docs/k8s-semantics.md
("RBAC") has the upstream lines.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from serving.checks.policy.common import Props, finding, kind_of, pod_templates, resource_rule, stack_rule
from serving.plan.model import Fleet
from serving.render.k8s import gateway, runtime, updater
from serving.render.k8s.common import UPDATER_APP
from serving.render.k8s.fleet import group_name, workload_kind
from serving.result import CheckResult
from serving.rollout.backends.kubernetes import batch_lease_name

ALL = "*"
HOST_NAMESPACES = ("hostNetwork", "hostPID", "hostIPC")
# (kind, name) of the only workloads whose pods may share a host namespace, and which one. The RDMA shared device
# plugin finds the HCAs it advertises by their network devices (its config selects them by ifName/linkType) and
# upstream's own DaemonSet runs it on the host network: in a pod network namespace it sees only the pod's veth.
HOST_NAMESPACE_ALLOWED = {("DaemonSet", "rdma-shared-device-plugin"): frozenset({"hostNetwork"})}
# Service accounts whose pods call the API server (each has a Role in the allowlist): every other pod runs with
# automountServiceAccountToken: false. The RDMA device plugin is upstream's (it talks to the kubelet's device-plugin
# socket, not the API server) and is rendered without the field: it is named here until its render sets it.
API_ACCOUNTS = frozenset({UPDATER_APP, runtime.CONTROLLER, runtime.AGENT, gateway.NAME})
TOKEN_PENDING = frozenset({("DaemonSet", "rdma-shared-device-plugin")})
RBAC_KINDS = frozenset({"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"})


@dataclass(frozen=True)
class Grant:
    """Verbs on one resource of one API group; ``names`` None: any name (``create`` and ``list`` carry no name, so
    RBAC cannot narrow them), else a rule granting them must name only these."""

    group: str
    resource: str
    verbs: frozenset[str]
    names: frozenset[str] | None
    why: str


@dataclass(frozen=True)
class Account:
    """A service account's Role: its name, and every grant the account's code needs."""

    account: str
    role: str
    who: str
    grants: tuple[Grant, ...]


def _grant(group: str, resource: str, verbs: str, names: Sequence[str] | None, why: str) -> Grant:
    return Grant(group, resource, frozenset(verbs.split()), None if names is None else frozenset(names), why)


def allowlist(fleet: Fleet) -> dict[str, Account]:
    """Role name → the account and its grants, for the stack's fleet (module doc: the calls behind each)."""
    spec, ns = fleet.spec, fleet.spec.kubernetes.namespace
    api_version, kind = workload_kind(fleet)
    serving_pods = updater.leader_pods(fleet.plan)
    groups = [group_name(g) for g in range(spec.rollout.batches)]
    pod_writes = "patch delete" if kind == "StatefulSet" else "patch"  # an OnDelete StatefulSet needs the delete
    lease = "coordination.k8s.io"
    accounts = [
        Account(
            UPDATER_APP,
            updater.ROLE,
            "the rolling updater",
            (
                _grant(
                    api_version.rsplit("/", 1)[0], f"{kind.lower()}s", "get patch", groups, "read and patch a group"
                ),
                _grant("", "pods", "list", None, "list a group's pods by label"),
                _grant("", "pods", pod_writes, serving_pods, "admit/hold (and replace) a replica's serving pod"),
                _grant(lease, "leases", "create", None, "announce a rollout batch (create carries no name)"),
                _grant(lease, "leases", "get update", [batch_lease_name(ns)], "the rollout announcement Lease"),
            ),
        ),
        Account(
            runtime.CONTROLLER,
            runtime.CONTROLLER_ROLE,
            "the fleet controller",
            (
                _grant(lease, "leases", "get update", [spec.runtime.lease_name], "its election Lease"),
                _grant(lease, "leases", "create", None, "the first leader creates the Lease"),
                _grant("", "pods", "get", serving_pods, "read the pod it restarts"),
                _grant("", "pods/eviction", "create", serving_pods, "restart a replica within its budget"),
            ),
        ),
        Account(
            runtime.AGENT,
            f"{runtime.AGENT}-pods",
            "the node agent",
            (_grant("", "pods", "get list", None, "list the serving pods on its node"),),
        ),
        Account(
            gateway.NAME,
            f"{gateway.NAME}-discovery",
            "the router's service discovery",
            (_grant("", "pods", "get list watch", None, "discover the serving pods"),),
        ),
    ]
    return {a.role: a for a in accounts}


def _strings(value: Any) -> list[str]:
    return [str(v) for v in value or []]


def _show(rule: Mapping[str, Any]) -> str:
    keys = ("apiGroups", "resources", "resourceNames", "verbs", "nonResourceURLs")
    return "{" + ", ".join(f"{k}: {_strings(rule[k])}" for k in keys if rule.get(k) is not None) + "}"


def rule_problems(rule: Mapping[str, Any], account: Account) -> list[str]:
    """What ``rule`` grants beyond ``account``'s allowlist ([] when nothing)."""
    groups, resources = _strings(rule.get("apiGroups")), _strings(rule.get("resources"))
    verbs, names = _strings(rule.get("verbs")), _strings(rule.get("resourceNames"))
    problems = []
    if rule.get("nonResourceURLs"):
        problems.append(f"nonResourceURLs {_strings(rule.get('nonResourceURLs'))}")
    wild = [f for f, values in (("apiGroups", groups), ("resources", resources), ("verbs", verbs)) if ALL in values]
    wild += [f for f, values in (("resources", resources),) if any(v.startswith("*/") for v in values)]
    if wild:
        problems.append(f"a wildcard in {', '.join(sorted(set(wild)))}")
        return problems
    for group in groups:
        for resource in resources:
            for verb in verbs:
                grants = [g for g in account.grants if (g.group, g.resource) == (group, resource) and verb in g.verbs]
                where = f"{verb} on {resource}" + (f" ({group})" if group else "")
                if not grants:
                    problems.append(f"{where}, which {account.who} never calls")
                elif all(g.names is not None for g in grants):
                    allowed = set().union(*(g.names or () for g in grants))
                    if not names:
                        problems.append(f"{where} for any name (only {sorted(allowed)[:3]}… may be named)")
                    elif extra := sorted(set(names) - allowed):
                        problems.append(f"{where} for {extra[:5]}, names {account.who} never uses")
    return problems


def _allowed(account: Account) -> str:
    return "; ".join(
        f"{' '.join(sorted(g.verbs))} {g.resource}"
        + (f" ({g.group})" if g.group else "")
        + ("" if g.names is None else f" by name ({len(g.names)})")
        for g in account.grants
    )


def _rbac_findings(resource_type: str, props: Props, roles: Mapping[str, Account], ns: str) -> Iterator[CheckResult]:
    kind, meta = kind_of(resource_type, props), props.get("metadata") or {}
    name = str(meta.get("name") or "")
    fix_role = (
        "Render the Role with exactly its account's calls (serving.render.k8s.updater / runtime / gateway); when the "
        "code makes a new call, add its grant to serving.checks.policy.access.allowlist with the call that needs it."
    )
    if kind in ("ClusterRole", "ClusterRoleBinding"):
        yield finding(
            "rbac-allowlist",
            resource_type,
            props,
            f"a {kind}: it grants beyond the stack's namespace {ns!r}",
            "namespaced Roles and RoleBindings only (the project renders no cluster-wide access)",
            f"Remove the {kind}; grant what an account's code calls in a Role of namespace {ns!r}.",
        )
        return
    account = roles.get(name)
    if account is None:
        yield finding(
            "rbac-allowlist",
            resource_type,
            props,
            f"a {kind} named {name!r}, which the allowlist does not know",
            f"one of the Roles {sorted(roles)}, each bound to its own account",
            fix_role,
        )
        return
    where = [] if meta.get("namespace") == ns else [f"namespace {meta.get('namespace')!r}, not the stack's {ns!r}"]
    if kind == "RoleBinding":
        ref = props.get("roleRef") or {}
        subjects = [dict(s) for s in props.get("subjects") or []]
        want = [{"kind": "ServiceAccount", "name": account.account, "namespace": ns}]
        if (ref.get("kind"), ref.get("name")) != ("Role", account.role):
            where.append(f"roleRef {ref.get('kind')}/{ref.get('name')}, not Role/{account.role}")
        if subjects != want:
            where.append(f"subjects {subjects}, not {want}")
        if where:
            yield finding(
                "rbac-allowlist",
                resource_type,
                props,
                "; ".join(where),
                f"RoleBinding {account.role} binding Role {account.role} to ServiceAccount {ns}/{account.account} only",
                "Bind each Role to its own account only (serving.render.k8s.common.service_account_with_role).",
            )
        return
    for i, rule in enumerate(props.get("rules") or []):
        if problems := rule_problems(rule, account):
            where.append(f"rules[{i}] {_show(rule)} grants {'; '.join(problems)}")
    if where:
        yield finding(
            "rbac-allowlist",
            resource_type,
            props,
            "; ".join(where),
            f"{account.who}'s allowlist: {_allowed(account)}",
            "Remove the extra rule, verb or name. " + fix_role,
        )


@stack_rule(
    "rbac-allowlist",
    "Every Role holds exactly the calls its account's code makes (the updater, the controller, the agent, the router's "
    "discovery): no extra verb, resource, subresource, name or wildcard, no ClusterRole, each bound to its own account.",
)
def rbac_allowlist(resources: Sequence[tuple[str, Props]], fleet: Fleet) -> list[CheckResult]:
    roles, ns = allowlist(fleet), fleet.spec.kubernetes.namespace
    return [f for t, p in resources if kind_of(t, p) in RBAC_KINDS for f in _rbac_findings(t, p, roles, ns)]


@resource_rule(
    "pod-host-isolation",
    "No pod shares a host namespace (hostNetwork, hostPID, hostIPC; only the RDMA device plugin its host's network), "
    "and a pod whose service account calls no API (serving, cache warmer) mounts no service-account token.",
)
def pod_host_isolation(resource_type: str, props: Props) -> list[CheckResult]:
    kind, name = kind_of(resource_type, props), str((props.get("metadata") or {}).get("name") or "")
    allowed = HOST_NAMESPACE_ALLOWED.get((kind, name), frozenset())
    out = []
    for where, template in pod_templates(resource_type, props):
        pod = template.get("spec") or {}
        shared = [f for f in HOST_NAMESPACES if pod.get(f) and f not in allowed]
        if shared:
            out.append(
                finding(
                    "pod-host-isolation",
                    resource_type,
                    props,
                    f"{where}.spec sets {', '.join(f'{f}: true' for f in shared)}: the pod shares the node's "
                    + " and ".join(
                        {"hostNetwork": "network", "hostPID": "processes", "hostIPC": "IPC"}[f] for f in shared
                    )
                    + " (in this privileged namespace no Pod Security level refuses it)",
                    "no host namespace on any pod (only DaemonSet rdma-shared-device-plugin on the host network)",
                    f"Remove {', '.join(shared)} from the pod template; a pod reaches its node's services through "
                    "its own network (the agent probes the serving pods by pod IP).",
                )
            )
        account = str(pod.get("serviceAccountName") or pod.get("serviceAccount") or "default")
        if account in API_ACCOUNTS or (kind, name) in TOKEN_PENDING:
            continue
        if pod.get("automountServiceAccountToken") is not False:
            value = pod.get("automountServiceAccountToken")
            out.append(
                finding(
                    "pod-host-isolation",
                    resource_type,
                    props,
                    f"{where}.spec.automountServiceAccountToken is {value!r}: the pod mounts a service-account token "
                    f"of {account!r} it never uses (its processes call no API), which anything that runs in it can "
                    "replay",
                    f"automountServiceAccountToken: false on every pod whose account is not one of {sorted(API_ACCOUNTS)}",
                    "Set automountServiceAccountToken: false in the pod template (serving.render.k8s.fleet, storage); "
                    "a pod that must call the API runs as its own account with a Role in "
                    "serving.checks.policy.access.allowlist.",
                )
            )
    return out
