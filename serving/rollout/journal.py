"""Durable rollout state: the journal (JSON lines, one fsync'd record per transition) and the lock.

Layout under the stack's state directory, ``<state dir>/<stack>/`` (:func:`serving.paths.state_dir`: ``--state-dir``,
``$EXASERVE_STATE_DIR``, else ``$XDG_STATE_HOME/exaserve``; never the package or the checkout)::

    rollout.lock                 fcntl lock held by the one updater of this stack (holder in the file)
    rollout/journal.jsonl        the latest rollout: line 1 its plan, then one event per line
    rollout/history/*.jsonl      earlier rollouts, moved there when a new one starts
    sandbox/                     the sandbox's process records (``exaserve sandbox``)

Every record is written with one ``write`` and ``fsync`` before the updater acts on the new state,
so after a SIGKILL the journal holds every transition that happened; a torn last line (killed
mid-write) is dropped on read — the step it described is simply run again (steps are idempotent).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving.paths import state_dir
from serving.rollout.machine import Event, RolloutState, replay
from serving.rollout.plan import RolloutPlan


class JournalError(RuntimeError):
    """The journal cannot be read; the message names the file, the line and what to do."""


class LockedError(RuntimeError):
    """Another updater holds the stack's lock."""


@dataclass(frozen=True)
class StackState:
    """The state directory of one stack."""

    root: Path

    @classmethod
    def for_stack(cls, stack: str, root: Path | None = None) -> StackState:
        """``stack``'s directory under ``root`` (``--state-dir``), else under :func:`serving.paths.state_dir`'s default."""
        return cls(state_dir(root) / stack)

    @property
    def lock_path(self) -> Path:
        return self.root / "rollout.lock"

    @property
    def journal_path(self) -> Path:
        return self.root / "rollout" / "journal.jsonl"

    @property
    def history_dir(self) -> Path:
        return self.root / "rollout" / "history"

    @property
    def sandbox_dir(self) -> Path:
        return self.root / "sandbox"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Journal:
    """Append-only JSON-lines journal of one rollout."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seq = 0

    @classmethod
    def create(cls, path: Path, plan: RolloutPlan) -> Journal:
        """Start a new journal for ``plan``; an existing journal is moved to ``history/`` first."""
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            history = path.parent / "history"
            history.mkdir(exist_ok=True)
            path.replace(history / f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.jsonl")
        journal = cls(path)
        journal._append({"plan": plan.to_json()})
        _fsync_dir(path.parent)
        return journal

    @classmethod
    def open(cls, path: Path) -> tuple[Journal, RolloutPlan, list[Event]]:
        """Read a journal (dropping a torn last line) and reopen it for appending."""
        plan, events, good_bytes = _read(path)
        with path.open("r+b") as f:
            f.truncate(good_bytes)
            f.flush()
            os.fsync(f.fileno())
        journal = cls(path)
        journal._seq = len(events) + 1
        return journal, plan, events

    def _append(self, record: dict[str, Any]) -> None:
        line = json.dumps({"seq": self._seq, "written_at": time.time(), **record}, separators=(",", ":")) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        self._seq += 1

    def record(self, event: Event) -> None:
        self._append({"event": event.to_json()})


def _read(path: Path) -> tuple[RolloutPlan, list[Event], int]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise JournalError(f"{path}: no journal; start a rollout with `exaserve rollout --to VERSION`") from None
    lines = raw.split(b"\n")
    plan: RolloutPlan | None = None
    events: list[Event] = []
    good = 0
    for n, line in enumerate(lines, 1):
        if n == len(lines):
            break  # no newline after it (or nothing): a torn write, dropped
        try:
            record = json.loads(line)
            if "plan" in record:
                if plan is not None:
                    raise ValueError("a second plan record")
                plan = RolloutPlan.from_json(record["plan"])
            else:
                events.append(Event.from_json(record["event"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise JournalError(
                f"{path}:{n}: unreadable record ({exc}); the journal is damaged — move it aside and "
                "check the fleet by hand (`exaserve rollback` then restores the stable version)"
            ) from None
        good += len(line) + 1
    if plan is None:
        raise JournalError(f"{path}: no plan record; move the file aside and start again")
    return plan, events, good


def load_state(path: Path) -> RolloutState | None:
    """The state the journal at ``path`` leads to, or None when there is no journal."""
    if not path.exists():
        return None
    plan, events, _ = _read(path)
    return replay(plan, events)


@dataclass(frozen=True)
class PastRollout:
    """One journal of the stack: where it is, the state it leads to and when its first and last events were."""

    path: Path
    state: RolloutState
    first_at: float | None
    last_at: float | None


def history(paths: StackState) -> list[PastRollout]:
    """Every rollout, rollback and revert of the stack, oldest first: the journals in ``history/`` (named by their
    start) and the latest one. A damaged journal raises :class:`JournalError` naming it."""
    files = [*sorted(paths.history_dir.glob("*.jsonl")), paths.journal_path]
    out = []
    for path in files:
        if not path.exists():
            continue
        plan, events, _ = _read(path)
        times = [e.at for e in events]
        out.append(PastRollout(path, replay(plan, events), min(times, default=None), max(times, default=None)))
    return out


class StackLock:
    """An exclusive ``fcntl.flock`` on the stack's lock file; the kernel drops it when the holder
    dies (even by SIGKILL), so there are no stale locks. The file names the holder for the message."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, purpose: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode(errors="replace").strip() or "unknown holder"
            os.close(fd)
            raise LockedError(
                f"another updater holds {self.path} ({holder}); wait for it to finish, or stop it "
                "(SIGINT pauses it safely) before starting another"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}, {purpose}, since {time.strftime('%Y-%m-%d %H:%M:%S')}".encode())
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    @contextlib.contextmanager
    def held(self, purpose: str) -> Iterator[StackLock]:
        self.acquire(purpose)
        try:
            yield self
        finally:
            self.release()
