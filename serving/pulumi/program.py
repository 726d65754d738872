"""Run the Pulumi program in-process, with Pulumi's mocks in place of the engine, and collect what it registers.

The Pulumi engine cannot run here (FIELD-NOTES: no registry ships it); ``pulumi.runtime.set_mocks`` replaces
it, so the program that ``pulumi up`` runs is the one executed here, unchanged: ``infra/__main__.py`` is one line,
``fleet_stack(program_fleet())``, and this runner makes the same call from the package (so an installed
wheel renders without the checkout). ``program_dir`` runs another entry point directory via ``runpy`` instead, as
Pulumi's Python language host starts one. Every registration is recorded with its parent and provider; custom
Kubernetes resources carry the full camelCase object (``apiVersion``/``kind`` included) as their inputs. Numbers
cross the mock boundary as floats and are turned back into integers here.
"""

from __future__ import annotations

import asyncio
import os
import runpy
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime import rpc
from pulumi.runtime.mocks import MockMonitor, MockResourceArgs, Mocks
from pulumi.runtime.settings import ROOT
from pulumi.runtime.stack import run_in_stack

from serving.paths import ProjectNotFoundError, project_dir
from serving.plan.loader import load_fleet
from serving.plan.model import Fleet
from serving.pulumi.components import fleet_stack
from serving.pulumi.crds import pinned_crd
from serving.render.k8s.common import K8sObject
from serving.render.k8s.prerequisites import LWS_CRD
from serving.spec.stack import NAMESPACE, SpecError, Stack, pulumi_config, spec_from_config, stack_path

PROJECT = "exaserve"
# `exaserve render --stack-file FILE` tells the program which file to read (Pulumi itself always
# reads Pulumi.<stack>.yaml); set only for the duration of one in-process run.
STACK_FILE_ENV = "EXASERVE_STACK_FILE"
COMPONENT_PREFIX = "exaserve:"
STACK_TYPE = "pulumi:pulumi:Stack"
K8S_PREFIX = "kubernetes:"


def program_fleet() -> Fleet:
    """The fleet the Pulumi program deploys, its spec read the Pulumi way (``pulumi.Config("exaserve")``): under
    ``pulumi up`` that is the engine's resolved config (secrets, ESC environments, ``pulumi config set``); offline,
    :func:`run_program` feeds the same keys from the stack file (:func:`~serving.spec.stack.pulumi_config`)."""
    name = pulumi.get_stack()
    env_path = os.environ.get(STACK_FILE_ENV)
    path = Path(env_path) if env_path else stack_path(name, Path(pulumi.runtime.get_root_directory() or "."))
    spec = spec_from_config(pulumi.Config(NAMESPACE).get_object, f"pulumi config of stack {name}", path.parent)
    return load_fleet(name, spec)


@dataclass(frozen=True)
class Registration:
    """One resource the program registered (components, the provider and Kubernetes objects alike)."""

    urn: str
    type: str
    name: str
    parent: str
    provider: str
    custom: bool
    inputs: dict[str, Any]

    @property
    def is_component(self) -> bool:
        return self.type.startswith(COMPONENT_PREFIX)

    @property
    def is_kubernetes_object(self) -> bool:
        return self.custom and self.type.startswith(K8S_PREFIX)


@dataclass
class ProgramRun:
    stack: str
    registrations: list[Registration] = field(default_factory=list)
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    dependencies: dict[str, list[str]] = field(default_factory=dict)
    """URN → the URNs it was registered ``depends_on`` (what `pulumi up` orders it after)."""

    def by_urn(self) -> dict[str, Registration]:
        return {r.urn: r for r in self.registrations}

    def stack_outputs(self) -> dict[str, Any]:
        return next((self.outputs.get(r.urn, {}) for r in self.registrations if r.type == STACK_TYPE), {})

    def top_component(self, reg: Registration) -> Registration | None:
        """The outermost ``exaserve:`` component above ``reg`` (the concern it belongs to)."""
        by_urn = self.by_urn()
        found: Registration | None = None
        cur: Registration | None = reg
        while cur is not None:
            if cur.is_component:
                found = cur
            cur = by_urn.get(cur.parent)
        return found


def normalise(value: Any) -> Any:
    """Undo the mock boundary's number widening: integral floats back to ints, recursively."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: normalise(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalise(v) for v in value]
    return value


CRD_TYPE = "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"


class _Mocks(Mocks):
    """The 'engine': every resource is created with its inputs as its state; no calls are expected. A read of the
    LeaderWorkerSet CRD, the one CRD the program checks (:func:`~serving.render.k8s.prerequisites.lws_crd_problem`),
    gets the pinned upstream CRD as the cluster would return it (none found: its state stays unknown, unchecked)."""

    def new_resource(self, args: MockResourceArgs) -> tuple[str | None, dict[Any, Any]]:
        if args.typ == CRD_TYPE and args.resource_id == LWS_CRD:
            return args.resource_id, pinned_crd(LWS_CRD) or dict(args.inputs)
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args: Any) -> tuple[dict[Any, Any], list[tuple[str, str]] | None]:
        return {}, None


class _RecordingMonitor(MockMonitor):
    """The mock monitor, also recording each registration's parent, provider and outputs."""

    def __init__(self, run: ProgramRun) -> None:
        super().__init__(_Mocks())
        self._run = run
        self._lock = threading.Lock()
        self.thread_loops: set[asyncio.AbstractEventLoop] = set()

    def _note_thread_loop(self) -> None:
        """Remember the event loop Pulumi's mock monitor made for this executor thread (``_ensure_event_loop``) and
        never closes: once the run's executor has shut down, :func:`run_program` closes it. Left to the garbage
        collector at interpreter exit, such a loop can be finalised after its self-pipe socket, and its ``__del__``
        then prints a ValueError traceback on a user's terminal (CI: ``exaserve render`` exiting 2)."""
        try:
            loop = asyncio.get_event_loop_policy().get_event_loop()
        except RuntimeError:  # this thread has no loop: the call did not need one
            return
        if not loop.is_running():  # not the run's own loop
            with self._lock:
                self.thread_loops.add(loop)

    def ReadResource(self, request: Any) -> Any:
        try:
            return super().ReadResource(request)  # type: ignore[no-untyped-call]
        finally:
            self._note_thread_loop()

    def Invoke(self, request: Any) -> Any:
        try:
            return super().Invoke(request)  # type: ignore[no-untyped-call]
        finally:
            self._note_thread_loop()

    def RegisterResource(self, request: Any) -> Any:
        try:
            response = super().RegisterResource(request)  # type: ignore[no-untyped-call]
        finally:
            self._note_thread_loop()
        registered = self.resources.get(response.urn)
        reg = Registration(
            urn=response.urn,
            type=request.type,
            name=request.name,
            parent=request.parent,
            provider=request.provider,
            custom=bool(request.custom),
            inputs=normalise(registered.state) if registered is not None else {},
        )
        with self._lock:
            self._run.dependencies[response.urn] = list(request.dependencies)
            # set_mocks and run_in_stack each register the root stack; keep one.
            if reg.type != STACK_TYPE or all(r.urn != reg.urn for r in self._run.registrations):
                self._run.registrations.append(reg)
        return response

    def RegisterResourceOutputs(self, request: Any) -> Any:
        with self._lock:
            self._run.outputs[request.urn] = normalise(rpc.deserialize_properties(request.outputs))
        return super().RegisterResourceOutputs(request)  # type: ignore[no-untyped-call]


@contextmanager
def _stack_file_env(path: Path | None) -> Iterator[None]:
    old = os.environ.get(STACK_FILE_ENV)
    if path is not None:
        os.environ[STACK_FILE_ENV] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(STACK_FILE_ENV, None)
        else:
            os.environ[STACK_FILE_ENV] = old


def run_program(stack: str, *, stack_file: Path | None = None, program_dir: Path | None = None) -> ProgramRun:
    """Execute the Pulumi program for ``stack`` under mocks, as ``pulumi preview`` would, and record it: the
    package's :func:`fleet_stack`, or the entry point in ``program_dir``."""
    run = ProgramRun(stack=stack)
    monitor = _RecordingMonitor(run)
    try:
        config = pulumi_config(stack_file or stack_path(stack, project_dir()))
    except ProjectNotFoundError as exc:
        raise SpecError(f"--stack {stack}", [("", str(exc))]) from None

    def program() -> None:
        if program_dir is None:
            fleet_stack(program_fleet())
        else:
            runpy.run_path(str(program_dir), run_name="__main__")

    async def execute() -> None:
        # Pulumi's runtime creates its futures on the current event loop; inside this coroutine that is the
        # run's own loop, so the run never depends on a loop an earlier asyncio.run() (or test) left behind.
        ROOT.set(None)  # a fresh root stack resource per run (set_mocks creates one only when none exists)
        pulumi.runtime.set_mocks(monitor.mocks, project=PROJECT, stack=stack, preview=False, monitor=monitor)
        ROOT.set(None)  # run_in_stack creates the root stack that collects pulumi.export()s, as the language host does
        pulumi.runtime.set_all_config(config)  # the engine's part: the stack's config, as `pulumi up` passes it
        await run_in_stack(program)

    with _stack_file_env(stack_file):
        try:
            asyncio.run(execute())  # shuts its default executor down: no thread uses its loop after this
        finally:
            for loop in monitor.thread_loops:
                loop.close()
    return run


@dataclass(frozen=True)
class RenderedObject:
    """One Kubernetes object of a rendered stack and the Pulumi component that created it."""

    obj: K8sObject
    component: str
    resource_type: str

    @property
    def api_version(self) -> str:
        return str(self.obj.get("apiVersion", ""))

    @property
    def kind(self) -> str:
        return str(self.obj.get("kind", ""))

    @property
    def name(self) -> str:
        return str(self.obj.get("metadata", {}).get("name", ""))

    @property
    def namespace(self) -> str | None:
        ns = self.obj.get("metadata", {}).get("namespace")
        return None if ns is None else str(ns)

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.api_version, self.kind, self.namespace or "", self.name)

    def index_entry(self) -> dict[str, Any]:
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "namespace": self.namespace,
            "component": self.component,
        }


def kubernetes_objects(run: ProgramRun) -> list[RenderedObject]:
    """Every Kubernetes object the program registered, in registration order, with its component's name."""
    out: list[RenderedObject] = []
    for reg in run.registrations:
        if not reg.is_kubernetes_object:
            continue
        top = run.top_component(reg)
        out.append(RenderedObject(obj=reg.inputs, component=top.name if top else "", resource_type=reg.type))
    return out


def render_stack(stack: Stack, *, from_file: bool = False, program_dir: Path | None = None) -> list[RenderedObject]:
    """Run the program for ``stack`` and return its Kubernetes objects."""
    run = run_program(stack.name, stack_file=stack.path if from_file else None, program_dir=program_dir)
    return kubernetes_objects(run)
