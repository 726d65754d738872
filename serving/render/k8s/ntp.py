"""NTP: chrony on every node as a DaemonSet on the host network, holding only the SYS_TIME capability.

chrony.conf is rendered by :func:`serving.render.chrony.chrony_conf` from the spec's servers and offset limit; the
alert on a node's offset lives with the other alerts in :mod:`serving.render.k8s.monitoring`.
"""

from __future__ import annotations

from serving.render.chrony import chrony_conf
from serving.render.k8s.common import LABEL_NAME, K8sObject, labels, metadata
from serving.spec.schema import FleetSpec

COMPONENT = "ntp"
APP = "chrony"
CONFIGMAP = "chrony-conf"
# Pinned chrony image; started with our own chrony.conf instead of its entry point's generated one.
IMAGE = "cturra/ntp:4.6.1-r1"
CONF_DIR = "/etc/exaserve-chrony"


def render(spec: FleetSpec) -> list[K8sObject]:
    ns = spec.kubernetes.namespace
    lab = labels(COMPONENT, APP)
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata(CONFIGMAP, ns, lab),
            "data": {"chrony.conf": chrony_conf(spec)},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": metadata(APP, ns, lab),
            "spec": {
                "selector": {"matchLabels": {LABEL_NAME: APP}},
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
                "template": {
                    "metadata": {"labels": lab},
                    "spec": {
                        "hostNetwork": True,
                        "priorityClassName": "system-node-critical",
                        # Every node keeps time, whatever its taints.
                        "tolerations": [{"operator": "Exists"}],
                        "containers": [
                            {
                                "name": "chronyd",
                                "image": IMAGE,
                                # -d: foreground, log to stderr; -u root: stay uid 0 (no CAP_SETUID to switch).
                                "command": ["/usr/sbin/chronyd", "-d", "-u", "root", "-f", f"{CONF_DIR}/chrony.conf"],
                                "securityContext": {
                                    "privileged": False,
                                    "allowPrivilegeEscalation": False,
                                    "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"], "add": ["SYS_TIME"]},
                                },
                                "resources": {
                                    "requests": {"cpu": "10m", "memory": "16Mi"},
                                    "limits": {"memory": "64Mi"},
                                },
                                "volumeMounts": [
                                    {"name": "conf", "mountPath": CONF_DIR, "readOnly": True},
                                    {"name": "state", "mountPath": "/var/lib/chrony"},
                                    {"name": "run", "mountPath": "/run/chrony"},
                                ],
                            }
                        ],
                        "volumes": [
                            {"name": "conf", "configMap": {"name": CONFIGMAP}},
                            {"name": "state", "emptyDir": {}},
                            {"name": "run", "emptyDir": {"medium": "Memory"}},
                        ],
                    },
                },
            },
        },
    ]
