"""Deployment policies: pure rules over Kubernetes resources, shared by the CrossGuard pack (``policies/``, run by
``pulumi preview/up``) and ``exaserve check`` (run offline on the rendered stack).

A resource rule takes the Pulumi resource type and the resource's properties (the camelCase object) and
returns failing :class:`~serving.result.CheckResult`s; a stack rule takes every resource and the fleet
(the spec and its plan). Each result names the rule (``check``), the resource (``subject``), what is wrong with the offending value
(``observed``), what the rule asks for (``expected``) and the fix.

The rules live by concern in the package's modules (:mod:`.workloads`, :mod:`.real_cluster`, :mod:`.stack`, :mod:`.access`); each
registers its rules in :mod:`.common`'s two registries when imported, and importing the package imports every one.
"""

from __future__ import annotations

from collections.abc import Sequence

from serving.checks.policy.common import (
    RESOURCE_RULES,
    STACK_RULES,
    Props,
    ResourceRule,
    Rule,
    StackRule,
    describe,
)
from serving.plan.model import Fleet
from serving.result import CheckResult

# Importing a rule module registers its rules, in import order: the registries' order (workloads' resource rules
# before real_cluster's), which the pack declares and `exaserve check` lists.
# isort: split
from serving.checks.policy import workloads  # noqa: F401

# isort: split
from serving.checks.policy import access, real_cluster, stack  # noqa: F401

__all__ = ["RESOURCE_RULES", "STACK_RULES", "ResourceRule", "Rule", "StackRule", "check", "describe"]


def check(resources: Sequence[tuple[str, Props]], fleet: Fleet) -> list[CheckResult]:
    """Every rule over every resource; the offline twin of the CrossGuard pack."""
    findings = [f for t, p in resources for _, fn in RESOURCE_RULES.values() for f in fn(t, p)]
    findings += [f for _, fn in STACK_RULES.values() for f in fn(resources, fleet)]
    return findings
