"""Pure renderers: the fleet spec → Kubernetes objects (camelCase dicts, exactly what the API server takes).

One module per concern of the Pulumi program (``infra/``): each exposes ``render(spec) -> list[dict]``.
The Pulumi components create one resource per object; the policies (:mod:`serving.checks.policy`), the
offline render (``exaserve render``) and the tests read the same objects.
"""
