"""Schema validation of rendered objects: built-in kinds against the Kubernetes OpenAPI schemas that
kubernetes-validate ships (strict: unknown fields are errors), custom resources against the upstream CRDs'
``openAPIV3Schema``.

kubernetes-validate's own ``validate()`` reloads the schema for every document (83 s for 3,077 documents,
FIELD-NOTES); here one compiled validator per (apiVersion, kind) is cached, which is what makes validating a
whole fleet take milliseconds. CRD schemas are made strict the same way: an object schema that lists its
properties (and does not preserve unknown fields) rejects any other field, where the API server would
silently prune it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from kubernetes_validate import utils as kv
from packaging.version import Version
from referencing import Registry, Resource

from serving.render.k8s.common import K8sObject

OBJECT_META = "https://kubernetes.io/api/_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
# Every custom resource has these, validated by the API server itself (metadata as a strict ObjectMeta).
ROOT_FIELDS: dict[str, Any] = {
    "apiVersion": {"type": "string"},
    "kind": {"type": "string"},
    "metadata": {"$ref": OBJECT_META},
}


class SchemaSetupError(Exception):
    """The validator cannot be set up (unsupported Kubernetes version, unreadable CRD directory)."""


@dataclass(frozen=True)
class SchemaProblem:
    resource: str
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.resource}: {self.path or '(root)'}: {self.message}"


def supported_versions() -> list[str]:
    return list(kv.all_versions())


def _schema_version(k8s_version: str) -> str:
    """The newest schema set not newer than ``k8s_version`` (what kubernetes-validate picks)."""
    versions = supported_versions()
    target = Version(k8s_version)
    usable = [v for v in versions if Version(v) <= target]
    if not usable or target > Version(versions[-1]):
        raise SchemaSetupError(
            f"kubernetes.version {k8s_version!r} is outside the schemas kubernetes-validate ships "
            f"({kv.major_minor(versions[0])}–{kv.major_minor(versions[-1])}); pick a version in that range or upgrade kubernetes-validate"
        )
    return usable[-1]


def _strict(schema: Any) -> Any:
    """A copy of a CRD schema in which every object with listed properties rejects unlisted ones."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


# spec.group and spec.names.kind of a CRD file, found without parsing it (the LWS CRD is 1.3 MB of YAML).
_CRD_GROUP = re.compile(r"^  group: *['\"]?([^'\"\s]+)", re.MULTILINE)
_CRD_KIND = re.compile(r"^    kind: *['\"]?([^'\"\s]+)", re.MULTILINE)


def _crd_schemas(path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """``(apiVersion, kind) → strict openAPIV3Schema`` for every CRD version in one YAML file."""
    schemas: dict[tuple[str, str], dict[str, Any]] = {}
    for doc in yaml.load_all(path.read_text(), Loader=yaml.CSafeLoader):
        if not isinstance(doc, dict) or doc.get("kind") != "CustomResourceDefinition":
            continue
        group, kind = doc["spec"]["group"], doc["spec"]["names"]["kind"]
        for version in doc["spec"]["versions"]:
            schema = version.get("schema", {}).get("openAPIV3Schema")
            if schema is not None:
                strict = _strict(schema)
                strict["properties"] = {**strict.get("properties", {}), **ROOT_FIELDS}
                schemas[(f"{group}/{version['name']}", kind)] = strict
    return schemas


class CrdCatalog:
    """The CRDs of a directory, each file parsed only when one of its kinds is validated."""

    def __init__(self, crd_dir: Path) -> None:
        if not crd_dir.is_dir():
            raise SchemaSetupError(
                f"CRD directory {crd_dir} does not exist; pass a directory holding the upstream CRDs "
                "(serving.pulumi.crds.resolve_crd_dir finds the pinned ones)"
            )
        self.crd_dir = crd_dir
        self._files: dict[tuple[str, str], Path] = {}
        self._unindexed: list[Path] = []
        for path in sorted(crd_dir.glob("*.yaml")):
            text = path.read_text()
            group, kind = _CRD_GROUP.search(text), _CRD_KIND.search(text)
            if group and kind:
                self._files[(group.group(1), kind.group(1))] = path
            else:
                self._unindexed.append(path)
        self._schemas: dict[tuple[str, str], dict[str, Any]] = {}

    def schema(self, api_version: str, kind: str) -> dict[str, Any] | None:
        key = (api_version, kind)
        if key not in self._schemas:
            group = api_version.rpartition("/")[0]
            for path in [p for p in [self._files.pop((group, kind), None)] if p] + self._unindexed:
                self._schemas.update(_crd_schemas(path))
            self._unindexed = []
        return self._schemas.get(key)


def _describe(obj: K8sObject) -> str:
    meta = obj.get("metadata") or {}
    where = f"{meta['namespace']}/{meta.get('name', '?')}" if meta.get("namespace") else meta.get("name", "?")
    return f"{obj.get('kind', '?')} {where}"


class Validator:
    """Validates objects; compiled schemas are cached per (apiVersion, kind)."""

    def __init__(self, k8s_version: str, crd_dir: Path | None) -> None:
        self.k8s_version = _schema_version(k8s_version)
        self._schema_dir = f"kubernetes-json-schema/v{self.k8s_version}-local-strict"
        self._crds = CrdCatalog(crd_dir) if crd_dir is not None else None
        self.crd_dir = crd_dir
        # Objects with no schema at all while no CRD directory was given: reported, not failed.
        self.unvalidated: list[str] = []
        self._cache: dict[tuple[str, str], jsonschema.protocols.Validator | None] = {}
        self._registry: Registry[Any] | None = None

    def _definitions(self) -> Registry[Any]:
        if self._registry is None:
            defs = kv.schema_contents(f"{self._schema_dir}/_definitions.json", self.k8s_version)
            self._registry = Resource.from_contents(defs) @ Registry()
        return self._registry

    def _builtin(self, api_version: str, kind: str) -> jsonschema.protocols.Validator | None:
        # rbac.authorization.k8s.io/v1 → rbac-v1; apps/v1 → apps-v1; v1 → v1 (kubernetes-validate's file names)
        mangled = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
        try:
            schema = kv.schema_contents(f"{self._schema_dir}/{kind.lower()}-{mangled}.json", self.k8s_version)
        except FileNotFoundError:
            return None
        registry = Resource.from_contents(schema) @ self._definitions()
        return jsonschema.Draft202012Validator(schema, registry=registry)

    def _validator(self, api_version: str, kind: str) -> jsonschema.protocols.Validator | None:
        key = (api_version, kind)
        if key not in self._cache:
            crd = self._crds.schema(api_version, kind) if self._crds is not None else None
            self._cache[key] = (
                jsonschema.Draft202012Validator(crd, registry=self._definitions())
                if crd is not None
                else self._builtin(api_version, kind)
            )
        return self._cache[key]

    def problems(self, obj: K8sObject) -> list[SchemaProblem]:
        api_version, kind = str(obj.get("apiVersion", "")), str(obj.get("kind", ""))
        validator = self._validator(api_version, kind)
        if validator is None:
            if self.crd_dir is None:
                self.unvalidated.append(_describe(obj))
                return []
            return [
                SchemaProblem(
                    _describe(obj),
                    "",
                    f"no schema for {kind} ({api_version}) in Kubernetes {self.k8s_version} nor in the CRDs in "
                    f"{self.crd_dir}; "
                    "add its CustomResourceDefinition to the CRD directory",
                )
            ]
        return [
            SchemaProblem(_describe(obj), ".".join(str(p) for p in err.absolute_path), err.message)
            for err in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
        ]

    def validate_all(self, objects: Iterable[K8sObject]) -> list[SchemaProblem]:
        return [p for obj in objects for p in self.problems(obj)]
