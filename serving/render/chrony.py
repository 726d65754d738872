"""chrony.conf for every node, from the spec's NTP servers and offset limit (one renderer for the Ansible
role and the Kubernetes ConfigMap alike)."""

from __future__ import annotations

from serving.render.common import render_template
from serving.spec.schema import FleetSpec


def chrony_conf(spec: FleetSpec) -> str:
    """chrony.conf for every node: the spec's servers; step and source-distance limits from the offset limit."""
    ntp = spec.cluster.ntp
    limit_s = ntp.max_offset_ms / 1000
    return render_template(
        "chrony.conf.j2",
        __name__,
        servers=ntp.servers,
        max_offset_ms=f"{ntp.max_offset_ms:g}",
        limit_s=f"{limit_s:g}",
    )
