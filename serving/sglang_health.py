"""SGLang's health endpoints, as every part of ExaServe that asks a server whether it is healthy uses them.

SGLang 0.5.23 serves one handler at two paths (`http_server.py:721-722`, `health_generate`): both answer 503 while
the server starts or shuts down; otherwise `/health_generate` runs a one-token generation through the scheduler and
polls for it with `await asyncio.sleep(1)` first (`:781-782`), so a healthy answer takes at least 1 s, and `/health`
does the same unless SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION is false (`:746-750`; on by default, `environ.py:344`),
which the server's environment sets (SERVER_ENV): the routers check `/health`, at most 128 at once each (smg;
serving.plan.planner.ROUTER_PROBES_IN_FLIGHT), and 2,048 checks of ≥ 1 s every 5 s would need 410 at once. The node
agents, the readiness and startup probes and the rollout's warm-up ask `/health_generate`, which needs the scheduler.
The drain waits on the scheduler's endpoint too: a wedged scheduler's ``/health`` still answers 200.
"""

from __future__ import annotations

from typing import Final

HEALTH_PATH: Final = "/health"
HEALTH_ENDPOINT_GENERATION: Final = False  # SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION, as the server env renders it
SCHEDULER_HEALTH_PATH: Final = "/health_generate"
HEALTH_POLL_S: Final = 1.0  # `await asyncio.sleep(1)` before each look at the scheduler's last output


def server_health_timeout_s(caller_timeout_s: int) -> int:
    """SGLANG_HEALTH_CHECK_TIMEOUT for callers that give ``/health_generate`` ``caller_timeout_s`` whole seconds: one
    poll less, so SGLang's own verdict (503 at its first look past the timeout) arrives before the caller gives up.
    With the two equal, the kubelet's and the agent's HTTP clients hang up at the moment of SGLang's last look, so a
    3 s timeout judged 2 s of silence anyway, as a timeout instead of SGLang's 503 (and SGLang marks itself
    UnHealthy on its own timeout, ``http_server.py``, which a SIGTERM then takes as a reason to exit undrained)."""
    return max(1, caller_timeout_s - int(HEALTH_POLL_S))
