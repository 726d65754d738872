"""``promtool check rules`` on the rendered alert rules: Prometheus's own parser, when ``promtool`` is installed
(Debian's ``prometheus`` package; ``scripts/bootstrap.sh`` installs it). Without it the caller warns, naming what
was not checked."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from serving.result import CheckResult, Status

CHECK = "promtool-check-rules"
NOT_INSTALLED = (
    "promtool is not installed: the alert rules of the PrometheusRule objects were not checked by Prometheus's parser"
)


def rule_file(objects: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Every PrometheusRule's groups as one Prometheus rule file."""
    return {"groups": [g for o in objects if o.get("kind") == "PrometheusRule" for g in o["spec"]["groups"]]}


def check_rules(objects: Iterable[dict[str, Any]], promtool: str | None = None) -> CheckResult:
    """Run ``promtool check rules`` on the objects' alert rules; ``skip`` when promtool is not installed."""
    exe = promtool or shutil.which("promtool")
    if exe is None:
        return CheckResult(CHECK, Status.SKIP, NOT_INSTALLED, "promtool check rules passes", None, "PrometheusRule")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rules.yaml"
        path.write_text(yaml.safe_dump(rule_file(objects), sort_keys=False))
        proc = subprocess.run([exe, "check", "rules", str(path)], capture_output=True, text=True, check=False)
        said = (proc.stdout + proc.stderr).strip().replace(str(path), "rules.yaml")
    if proc.returncode == 0:
        return CheckResult(CHECK, Status.PASS, said, "promtool check rules passes", None, "PrometheusRule")
    return CheckResult(
        CHECK,
        Status.FAIL,
        said,
        "promtool check rules passes",
        "Fix the expression promtool names in serving/render/k8s/monitoring.py.",
        "PrometheusRule",
    )
