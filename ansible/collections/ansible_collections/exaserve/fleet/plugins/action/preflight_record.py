"""Action plugin ``exaserve.fleet.preflight_record``: record preflight check results as the host's
``preflight_results`` fact.

Runs on the controller only (no SSH round trip). A failing check never fails the task: preflight
collects every result on every host and the final role (``preflight_report``) writes the report
and fails the hosts that have a failing check. Documented in plugins/modules/preflight_record.py
(where ansible-doc looks); docs/preflight.md describes the report.

Controller dependency: each entry is checked and normalised by ``serving.checks.preflight.check_result``
(the check catalogue and the record format ``exaserve preflight`` reads back), reached through
plugin_utils/controller.py, so a typo in a role fails the record task instead of adding a column
nobody reads.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.exaserve.fleet.plugins.plugin_utils.controller import controller

NAME = "exaserve.fleet.preflight_record"


class ActionModule(ActionBase):
    _supports_check_mode = True
    _requires_connection = False
    TRANSFERS_FILES = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        preflight = controller("serving.checks.preflight", NAME)
        result = super().run(tmp, task_vars)
        checks = self._task.args.get("checks")
        probe_error = self._task.args.get("probe_error")
        if isinstance(probe_error, dict):
            common = {k: probe_error.get(k, "") for k in ("observed", "expected", "fix")}
            checks = [{"check": c, "passed": False, **common} for c in probe_error.get("checks") or []]
        if not isinstance(checks, list) or not checks:
            raise AnsibleActionFail(
                f"{NAME}: give 'checks' (a non-empty list of {{check, passed|skip, ...}}) "
                "or 'probe_error' ({checks, observed, expected, fix})"
            )
        facts = (task_vars or {}).get("ansible_facts") or {}
        recorded = dict(facts.get("preflight_results") or {})
        failing = []
        for item in checks:
            if not isinstance(item, dict) or "check" not in item:
                raise AnsibleActionFail(f"{NAME}: every entry needs a 'check' name, got {item!r}")
            try:
                recorded[item["check"]] = preflight.check_result(str(item["check"]), item)
            except ValueError as exc:
                raise AnsibleActionFail(f"{NAME}: {exc}") from None
            if recorded[item["check"]]["status"] == "fail":
                failing.append(item["check"])
        result.update(
            changed=False,
            ansible_facts={"preflight_results": recorded},
            msg=f"failing: {', '.join(failing)}" if failing else "all recorded checks pass or skip",
        )
        return result
