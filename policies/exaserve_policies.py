"""CrossGuard wrappers around the pure rules in :mod:`serving.checks.policy` (every policy mandatory).

Resource policies see one Kubernetes resource at a time; stack policies see them all, plus the fleet (spec and
plan) of the stack being deployed (the Pulumi CLI names it in ``PULUMI_STACK`` for the analyzer). Each violation is
a :class:`~serving.result.CheckResult`, reported as ``<resource>: <observed> (expected …). Fix: …``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from serving.checks import policy
from serving.plan.loader import load_fleet
from serving.plan.model import Fleet
from serving.result import CheckResult, Status
from serving.spec.stack import SpecError, load_stack

K8S_PREFIX = "kubernetes:"
NAME = "exaserve"


def message(result: CheckResult) -> str:
    """The text CrossGuard shows for a violation: the resource, then the record's message."""
    return f"{result.subject}: {result.message}" if result.subject else result.message


def _resource_policy(rule: policy.Rule, fn: policy.ResourceRule) -> ResourceValidationPolicy:
    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        if not args.resource_type.startswith(K8S_PREFIX):
            return
        for result in fn(args.resource_type, args.props):
            report_violation(message(result), None)

    return ResourceValidationPolicy(
        name=rule.name,
        description=rule.description,
        validate=validate,
        enforcement_level=EnforcementLevel.MANDATORY,
    )


def stack_fleet(environ: Mapping[str, str] = os.environ) -> Fleet:
    """The fleet of the stack under deployment; SpecError when it cannot be determined or loaded."""
    name = environ.get("PULUMI_STACK", "")
    if not name:
        raise SpecError("PULUMI_STACK", [("", "not set; run the pack through `pulumi preview/up --policy-pack`")])
    stack = load_stack(name.rsplit("/", 1)[-1])
    return load_fleet(stack.name, stack.spec)


def _stack_policy(rule: policy.Rule, fn: policy.StackRule) -> StackValidationPolicy:
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        resources: list[tuple[str, Mapping[str, Any]]] = []
        urns: dict[str, str] = {}
        for r in args.resources:
            if r.resource_type.startswith(K8S_PREFIX):
                resources.append((r.resource_type, r.props))
                urns[policy.describe(r.resource_type, r.props)] = r.urn
        try:
            fleet = stack_fleet()
        except SpecError as exc:
            unchecked = CheckResult(
                rule.name,
                Status.FAIL,
                f"cannot check {rule.name}: {exc}",
                "the fleet spec of the stack under deployment",
                "Run the pack through `pulumi preview/up --policy-pack policies` (it sets PULUMI_STACK) on a stack "
                "whose fleet spec loads (`exaserve plan --stack NAME` names its problems).",
            )
            report_violation(message(unchecked), None)
            return
        for result in fn(resources, fleet):
            report_violation(message(result), urns.get(result.subject or ""))

    return StackValidationPolicy(
        name=rule.name,
        description=rule.description,
        validate=validate,
        enforcement_level=EnforcementLevel.MANDATORY,
    )


def policies() -> list[ResourceValidationPolicy | StackValidationPolicy]:
    """Every rule of serving.checks.policy as a mandatory CrossGuard policy."""
    out: list[ResourceValidationPolicy | StackValidationPolicy] = [
        _resource_policy(rule, fn) for rule, fn in policy.RESOURCE_RULES.values()
    ]
    out += [_stack_policy(rule, fn) for rule, fn in policy.STACK_RULES.values()]
    return out
