"""The per-stack state directory and its lock, as commands use them (``drill``; ``rollout``, ``rollback`` and
``sandbox up|down`` hold it below the command line, in :mod:`serving.rollout.operation` and
:mod:`serving.sandbox.lifecycle`): one updater per stack at a time, a held lock is bad input (exit 2)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from serving.cli.options import fail
from serving.rollout.journal import LockedError, StackLock, StackState
from serving.spec.stack import Stack


def stack_state(stack: Stack, state_dir: Path | None) -> StackState:
    """``stack``'s directory under ``--state-dir`` (or its default, :func:`serving.paths.state_dir`)."""
    return StackState.for_stack(stack.name, state_dir)


@contextmanager
def locked(paths: StackState, purpose: str) -> Iterator[None]:
    """Hold the stack's lock for ``purpose``; exit 2 naming the holder when another updater has it."""
    lock = StackLock(paths.lock_path)
    try:
        lock.acquire(purpose)
    except LockedError as exc:
        fail(str(exc))
    try:
        yield
    finally:
        lock.release()
