"""The stack loader's last step: a loaded stack becomes its :class:`~serving.plan.model.Fleet`, planned once.

This is the one caller of the planner (:func:`serving.plan.planner.plan`; ``tests/test_architecture.py`` walks every
call to keep it so): the CLI commands (after :func:`serving.cli.options.resolve_stack`), the Pulumi program
(:func:`serving.pulumi.program.program_fleet`), the policy pack, the benchmarks and the tests load a stack, call
:func:`load_fleet` once and hand the value on.
"""

from __future__ import annotations

from serving.plan.model import Fleet, MemoryModel
from serving.plan.planner import plan
from serving.spec.schema import FleetSpec


def load_fleet(name: str, spec: FleetSpec, memory_model: MemoryModel = "sglang") -> Fleet:
    """Stack ``name``'s fleet: ``spec`` and its plan (``memory_model``: which memory arithmetic sizes it)."""
    return Fleet(name=name, spec=spec, plan=plan(spec, memory_model))
