"""Whether this machine has a CUDA device, as torch sees it: the one rule for ``gpu``-marked tests.

``python -m tests.support.gpu`` prints the device count (scripts/test.sh deselects ``gpu`` tests when it is 0).
"""

from __future__ import annotations

import functools


@functools.cache
def cuda_device_count() -> int:
    """CUDA devices torch can use; 0 without a device, a driver or torch's CUDA build."""
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


if __name__ == "__main__":
    print(cuda_device_count())
