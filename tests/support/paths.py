"""Where the checkout is: tests read its stacks, docs and scripts; the package itself never does."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
