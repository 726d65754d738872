"""The ExaServe CrossGuard policy pack: `pulumi preview --policy-pack policies`. Starting it serves the pack
to the Pulumi engine (it blocks); tests call the policies' validate functions directly instead."""

from exaserve_policies import NAME, policies
from pulumi_policy import EnforcementLevel, PolicyPack

PolicyPack(name=NAME, enforcement_level=EnforcementLevel.MANDATORY, policies=policies())
