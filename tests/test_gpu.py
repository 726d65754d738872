"""GPU-only checks (marked ``gpu``): they run wherever torch sees a CUDA device (tests/conftest.py: skipped locally
without one, deselected by scripts/test.sh in CI without one, never skipped on a GPU machine).

The same fabric-check code path preflight uses, with the ``nccl`` backend on real GPUs: one rank per
GPU (``CUDA_VISIBLE_DEVICES`` per process, as one rank per node does in preflight), up to two.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from tests.support.gpu import cuda_device_count

pytestmark = pytest.mark.gpu


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_nccl_allreduce_on_real_gpus_reports_nccl_tests_figures() -> None:
    world = min(2, cuda_device_count())
    master = f"127.0.0.1:{_free_port()}"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "serving.node.fabric",
                "--rank",
                str(r),
                "--world-size",
                str(world),
                "--master",
                master,
                "--backend",
                "nccl",
                "--size-mib",
                "256",
                "--iterations",
                "10",
            ],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": str(r), "NCCL_SOCKET_IFNAME": "lo"},
        )
        for r in range(world)
    ]
    docs = []
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out
        docs.append(json.loads(out.strip().splitlines()[-1]))
    assert {d["backend"] for d in docs} == {"nccl"}
    assert all(d["time_s"] > 0 and d["algbw_gbs"] > 0 for d in docs)
    if world > 1:
        # busbw = algbw × 2(n−1)/n, as nccl-tests reports it.
        assert docs[0]["busbw_gbs"] == pytest.approx(docs[0]["algbw_gbs"] * 2 * (world - 1) / world)
