"""The load generator's own honesty, without a sandbox: what it reports when it cannot keep its schedule."""

from __future__ import annotations

import asyncio
import time

from serving.router.loadgen import TRANSPORT_ERROR, LoadGenerator, LoadReport, LoadSpec
from serving.sandbox.processes import free_port


def test_a_sender_held_past_its_schedule_counts_the_requests_it_sent_late() -> None:
    """Request i is due at i / rate. A sender that cannot keep that schedule (here its event loop blocked for 0.3 s,
    as a process starved of CPU is) sends the missed requests at once when it runs again: each left more than one
    interval after it was due and is counted late, so a run that offered less than its rate says so. Before, only a
    wait for a free slot counted, and a CI run offered 243/s for 300 with none counted."""
    rate = 100.0
    gen = LoadGenerator(LoadSpec(url=f"http://127.0.0.1:{free_port()}", rate_per_s=rate, duration_s=1.0, timeout_s=1.0))

    async def held() -> LoadReport:
        asyncio.get_running_loop().call_later(0.2, time.sleep, 0.3)
        return await gen.run()

    report = asyncio.run(held())
    assert report.count == 100 and report.status_counts == {TRANSPORT_ERROR: 100}  # nothing listens: refused
    # the ~30 requests due while the loop was held left late (the last one or two due in the hold may still leave
    # within their interval); the 70 due before or after it could be late only on a machine stalled besides
    assert 25 <= report.late <= 100, report.late
