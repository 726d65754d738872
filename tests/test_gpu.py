"""GPU-only checks (marked ``gpu``): they run wherever torch sees a CUDA device (tests/conftest.py: skipped locally
without one, deselected by scripts/test.sh in CI without one, never skipped on a GPU machine).

* The same fabric-check code path preflight uses, with the ``nccl`` backend on real GPUs: one rank per GPU
  (``CUDA_VISIBLE_DEVICES`` per process, as one rank per node does in preflight), up to two.
* The planner's GPU table against the device: ``memory.total`` as nvidia-smi reports it (what SGLang's
  ``get_nvgpu_memory_capacity`` reads), and the runtime overhead it subtracts before the weights against what a bare
  CUDA context with cuBLAS already takes on this device.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from serving.plan.calibration import GPU_PRODUCTS, RUNTIME_OVERHEAD_GIB
from serving.spec.schema import GIB
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


def _smi_gpus() -> list[tuple[str, int]]:
    """(name, memory.total MiB) of each GPU, as SGLang's ``get_nvgpu_memory_capacity`` asks nvidia-smi."""
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    rows = [line.rsplit(",", 1) for line in out.strip().splitlines()]
    return [(name.strip(), int(total)) for name, total in rows]


def test_the_gpu_table_holds_this_devices_memory_total_as_nvidia_smi_reports_it() -> None:
    gpus = _smi_gpus()
    assert gpus, "nvidia-smi listed no GPU"
    for name, total in gpus:
        label = name.replace(" ", "-")  # the nvidia.com/gpu.product label: GPU Feature Discovery's form of the name
        print(f"{label}: memory.total {total} MiB")
        assert label in GPU_PRODUCTS, (
            f"{label} is not in serving/plan/calibration.py GPU_PRODUCTS (memory.total {total})"
        )
        assert GPU_PRODUCTS[label].memory_total_mib == total, (label, GPU_PRODUCTS[label], total)


_CONTEXT_PROBE = """
import json, torch
a = torch.ones((1024, 1024), device="cuda", dtype=torch.bfloat16)
(a @ a).sum().item()  # a cuBLAS handle and its workspace, as every SGLang rank makes before its weights
torch.cuda.synchronize()
free, total = torch.cuda.mem_get_info()
print(json.dumps({"free": free, "total": total, "allocated": torch.cuda.memory_allocated()}))
"""


def test_the_planners_runtime_overhead_covers_a_bare_cuda_context_on_this_device() -> None:
    """SGLang's free memory at start is memory.total less the CUDA context, cuBLAS, NCCL and the allocator; the
    planner subtracts RUNTIME_OVERHEAD_GIB (fitted on public logs) for that. A bare context with a cuBLAS handle, in
    a fresh process on one GPU, is a floor under it: an overhead below the floor plans memory that is not there."""
    out = subprocess.run(
        [sys.executable, "-c", _CONTEXT_PROBE],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"},
    ).stdout
    doc = json.loads(out.strip().splitlines()[-1])
    taken_gib = (doc["total"] - doc["free"]) / GIB
    print(
        f"a bare CUDA context with cuBLAS takes {taken_gib:.3f} GiB; the planner subtracts {RUNTIME_OVERHEAD_GIB:.3f}"
    )
    assert 0 < taken_gib <= RUNTIME_OVERHEAD_GIB, (taken_gib, RUNTIME_OVERHEAD_GIB)
