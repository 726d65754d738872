"""Action plugin ``preflight_record``: record preflight check results as the host's ``preflight_results`` fact.

Runs on the controller only (no SSH round trip). A failing check never fails the task: preflight
collects every result on every host and the final role (``preflight_report``) writes the report
and fails the hosts that have a failing check. See docs/preflight.md.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleActionFail

from ansible.plugins.action import ActionBase

DOCUMENTATION = r"""
---
module: preflight_record
short_description: Record preflight check results for the host
description:
  - "Merges the given checks into the C(preflight_results) fact of the host
    (check name -> status, observed, expected, fix), for the C(preflight_report) role."
  - Controller-side only; never changes the node. Supports check mode.
options:
  checks:
    description:
      - One entry per check. C(check) is a name from C(serving.checks.preflight.CHECKS); C(passed) is the
        outcome, or C(skip) gives the reason the check does not apply; C(observed), C(expected)
        and C(fix) are shown to the user (C(fix) is required when the check fails).
    type: list
    elements: dict
    required: true
"""


class ActionModule(ActionBase):
    _supports_check_mode = True
    _requires_connection = False
    TRANSFERS_FILES = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        from serving.checks.preflight import check_result  # noqa: PLC0415 - the controller's venv provides serving

        result = super().run(tmp, task_vars)
        checks = self._task.args.get("checks")
        probe_error = self._task.args.get("probe_error")
        if isinstance(probe_error, dict):
            common = {k: probe_error.get(k, "") for k in ("observed", "expected", "fix")}
            checks = [{"check": c, "passed": False, **common} for c in probe_error.get("checks") or []]
        if not isinstance(checks, list) or not checks:
            raise AnsibleActionFail(
                "preflight_record: give 'checks' (a non-empty list of {check, passed|skip, ...}) "
                "or 'probe_error' ({checks, observed, expected, fix})"
            )
        facts = (task_vars or {}).get("ansible_facts") or {}
        recorded = dict(facts.get("preflight_results") or {})
        failing = []
        for item in checks:
            if not isinstance(item, dict) or "check" not in item:
                raise AnsibleActionFail(f"preflight_record: every entry needs a 'check' name, got {item!r}")
            try:
                recorded[item["check"]] = check_result(str(item["check"]), item)
            except ValueError as exc:
                raise AnsibleActionFail(f"preflight_record: {exc}") from None
            if recorded[item["check"]]["status"] == "fail":
                failing.append(item["check"])
        result.update(
            changed=False,
            ansible_facts={"preflight_results": recorded},
            msg=f"failing: {', '.join(failing)}" if failing else "all recorded checks pass or skip",
        )
        return result
