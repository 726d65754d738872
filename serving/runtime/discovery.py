"""Kubernetes: the serving pods on one node, as the router's service discovery sees them (``http://POD_IP:PORT``).

The agent's service account may ``get``/``list`` pods in the fleet's namespace and nothing else; the pods are
selected by the serving labels the router discovers (:func:`serving.render.router.server_selector`) and by
``spec.nodeName``. Only running pods with an IP are listed.
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from serving.kubeapi import KubeApi


class DiscoveryError(RuntimeError):
    """The API server refused or failed the pod listing."""


class NodePods:
    def __init__(self, api: KubeApi, namespace: str, selector: Mapping[str, str], node: str, port: int) -> None:
        self.path = f"/api/v1/namespaces/{namespace}/pods"
        self.params = {
            "labelSelector": ",".join(f"{k}={v}" for k, v in selector.items()),
            "fieldSelector": f"spec.nodeName={node}",
        }
        self.port = port
        self._http = api.client()

    async def replicas(self) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
        """(pod name, URL, GPU indices — unknown here, so none) of each running serving pod on the node."""
        try:
            response = await self._http.get(self.path, params=self.params)
        except httpx.HTTPError as exc:
            raise DiscoveryError(f"listing pods: {exc!r}") from exc
        if response.status_code != 200:
            raise DiscoveryError(f"listing pods answered {response.status_code}: {response.text[:300]}")
        out = []
        for pod in response.json().get("items", []):
            ip = pod.get("status", {}).get("podIP")
            if pod.get("status", {}).get("phase") == "Running" and ip:
                host = f"[{ip}]" if ":" in ip else ip
                out.append((str(pod["metadata"]["name"]), f"http://{host}:{self.port}", ()))
        return tuple(sorted(out))

    async def aclose(self) -> None:
        await self._http.aclose()
