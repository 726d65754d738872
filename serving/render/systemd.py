"""systemd units: one ``exaserve-sglang@<replica>.service`` per replica (per node of a multi-node replica).

The unit runs the command :mod:`serving.render.sglang` renders, with a start-up health check, a bounded
restart back-off and a journald rate limit. Rendered through ``templates/sglang-replica.service.j2``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Final

from serving.plan.model import Fleet, Replica
from serving.render.common import RenderError, rdma, render_template, whole_seconds
from serving.render.sglang import (
    SERVER_ENTRY,
    SERVICE_HOME,
    SERVICE_USER,
    server_argv,
    server_env,
)
from serving.sglang_health import SCHEDULER_HEALTH_PATH

CURL: Final = "/usr/bin/curl"


# systemd back-off: a fixed delay between restarts, and at most START_LIMIT_BURST starts within a
# window long enough for that many full start-ups; after that the unit stays failed and alerts.
RESTART_SEC: Final = 10


START_LIMIT_BURST: Final = 5


# journald: cap one replica's log rate; the source saw tens of MB/s from 3,072 chatty replicas.
LOG_RATE_LIMIT_INTERVAL_S: Final = 30


LOG_RATE_LIMIT_BURST: Final = 20000


_SYSTEMD_PLAIN = re.compile(r"[A-Za-z0-9_@+=:,./-]+")


_CONTROL = re.compile(r"[\x00-\x1f]")


def systemd_word(word: str, *, exec_line: bool) -> str:
    """Quote one word for a unit file: specifiers (%) always, variables ($) in Exec lines."""
    if _SYSTEMD_PLAIN.fullmatch(word):  # no specifier, variable, quote or control character: as it is
        return word
    if _CONTROL.search(word):
        raise RenderError(f"control character in {word!r}; unit files cannot carry it")
    escaped = word.replace("%", "%%")
    if exec_line:
        escaped = escaped.replace("$", "$$")
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def unit_name(replica: Replica, node_rank: int = 0) -> str:
    """``exaserve-sglang@<replica>.service`` (``-rank<N>`` on the nodes of a multi-node replica)."""
    suffix = "" if len(replica.nodes) == 1 else f"-rank{node_rank}"
    return f"exaserve-sglang@{replica.id}{suffix}.service"


def exec_lines(argv: Sequence[str], entry_words: int = len(SERVER_ENTRY)) -> list[str]:
    """The command as unit-file lines: the entry point (``entry_words`` words), then one flag with its values per
    line."""
    lines: list[list[str]] = [[]]
    for i, word in enumerate(argv):
        if word.startswith("--") and i >= entry_words:
            lines.append([])
        lines[-1].append(systemd_word(word, exec_line=True))
    return [" ".join(words) for words in lines]


def systemd_unit(fleet: Fleet, replica: Replica, node_rank: int = 0) -> str:
    """The systemd unit of one replica (one node of it, for a multi-node replica)."""
    argv = server_argv(fleet, replica, node_rank)
    host = str(replica.nodes[node_rank].address)
    nnodes = len(replica.nodes)
    s = fleet.spec.serving
    interval = whole_seconds(s.heartbeat_interval_s)
    start_timeout = whole_seconds(s.startup_budget_s)
    health_check: list[str] = []
    if node_rank == 0:  # only the first node of a replica serves HTTP
        health_check = [
            CURL, "--silent", "--show-error", "--fail", "--output", "/dev/null",
            "--retry", str(math.ceil(start_timeout / interval)), "--retry-delay", str(interval),
            "--retry-max-time", str(start_timeout), "--retry-connrefused", "--retry-all-errors",
            "--max-time", str(whole_seconds(s.health_check_timeout_s)),
            f"http://{host}:{replica.port}{SCHEDULER_HEALTH_PATH}",  # started: the scheduler answers
        ]  # fmt: skip
    return render_template(
        "sglang-replica.service.j2",
        __name__,
        unit=unit_name(replica, node_rank),
        replica_id=replica.id,
        node_rank=node_rank,
        nnodes=nnodes,
        model=fleet.spec.model.name,
        gpu_ids=",".join(str(i) for i in replica.gpu_ids),
        user=SERVICE_USER,
        state_directory=SERVICE_HOME.removeprefix("/var/lib/"),
        environment=[
            systemd_word(f"{k}={v}", exec_line=False) for k, v in server_env(fleet, replica, node_rank).items()
        ],
        exec_start=exec_lines(argv),
        health_check=" ".join(systemd_word(w, exec_line=True) for w in health_check),
        start_timeout_s=start_timeout,
        stop_timeout_s=whole_seconds(fleet.spec.rollout.drain_timeout_s),
        restart_s=RESTART_SEC,
        start_limit_burst=START_LIMIT_BURST,
        start_limit_interval_s=START_LIMIT_BURST * (start_timeout + RESTART_SEC),
        log_rate_interval_s=LOG_RATE_LIMIT_INTERVAL_S,
        log_rate_burst=LOG_RATE_LIMIT_BURST,
        log_level=fleet.spec.serving.log_level.value,
        rdma=rdma(fleet.spec),
    )
