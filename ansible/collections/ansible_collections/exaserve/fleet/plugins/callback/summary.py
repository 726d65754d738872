"""Callback ``exaserve.fleet.summary``: after the recap, one line per host state and the slowest tasks.

Enabled in ansible.cfg (``callbacks_enabled``). It prints how long the run took, how many hosts
ended ok, failed or unreachable (with their names), and the five slowest tasks, so a slow or
hanging node shows up without re-running with profiling.
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
name: summary
type: aggregate
author: ExaServe platform team (@exaserve-platform)
version_added: "0.1.0"
short_description: Wall time, host outcome and slowest tasks at the end of a run
description:
  - Prints the wall time, the hosts that failed or were unreachable, and the five slowest tasks.
requirements:
  - enable it in callbacks_enabled (ansible/ansible.cfg does, as exaserve.fleet.summary)
"""

import time
from typing import Any

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "exaserve.fleet.summary"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._start = time.monotonic()
        self._task_start: dict[str, tuple[str, float]] = {}
        self._durations: dict[str, float] = {}

    def _begin(self, task: Any) -> None:
        self._task_start[task._uuid] = (task.get_name(), time.monotonic())

    def v2_playbook_on_task_start(self, task: Any, is_conditional: bool) -> None:
        self._begin(task)

    def v2_playbook_on_handler_task_start(self, task: Any) -> None:
        self._begin(task)

    def _end(self, result: Any, *_args: Any, **_kwargs: Any) -> None:
        uuid = result._task._uuid
        if uuid in self._task_start:
            name, started = self._task_start[uuid]
            self._durations[name] = max(self._durations.get(name, 0.0), time.monotonic() - started)

    v2_runner_on_ok = v2_runner_on_failed = v2_runner_on_unreachable = v2_runner_on_skipped = _end

    def v2_playbook_on_stats(self, stats: Any) -> None:
        hosts = sorted(stats.processed)
        failed = [h for h in hosts if stats.summarize(h)["failures"]]
        dark = [h for h in hosts if stats.summarize(h)["unreachable"]]
        ok = len(hosts) - len(set(failed) | set(dark))
        self._display.display(
            f"EXASERVE SUMMARY: {len(hosts)} hosts in {time.monotonic() - self._start:.1f} s: {ok} ok, "
            f"{len(failed)} failed{' (' + ', '.join(failed) + ')' if failed else ''}, "
            f"{len(dark)} unreachable{' (' + ', '.join(dark) + ')' if dark else ''}"
        )
        slowest = sorted(self._durations.items(), key=lambda kv: -kv[1])[:5]
        for name, seconds in slowest:
            self._display.display(f"  {seconds:7.2f} s  {name}")
