"""The upstream CRDs custom resources are validated against: pinned in ``serving/data/crds.lock.json``, never copied.

The lock pins each file (repository, path, commit, sha256). :func:`resolve_crd_dir` is the one place a CRD directory
comes from, in this order:

1. ``--crd-dir DIR`` (``explicit``): the user's directory; every pinned file in it must match its sha256 (files it
   lacks are simply not there to validate with, files the lock does not name are the user's own);
2. ``../shared/crds`` beside the Pulumi project directory, when present (the offline mirror CI has);
3. the cache ``$XDG_CACHE_HOME/exaserve/crds/<lock hash>`` that ``python -m serving.pulumi.crds fetch`` fills
   (``scripts/bootstrap.sh`` runs it) from ``https://raw.githubusercontent.com/<repository>/<commit>/<path>``.

The mirror and the cache must hold every pinned file, each matching its sha256. A wrong hash is an error naming the
file, the expected and the actual hash.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

from serving.paths import ProjectNotFoundError, cache_dir, find_project_dir

LOCK_NAME = "crds.lock.json"
GITHUB_RAW = "https://raw.githubusercontent.com"
MIRROR = Path("..") / "shared" / "crds"  # relative to the Pulumi project directory
FETCH_TIMEOUT_S = 60


class CrdError(Exception):
    """A CRD directory that cannot be used (wrong hash, missing pinned file, failed fetch); the message says why."""


class NoCrdDirError(CrdError):
    """No ``--crd-dir``, no mirror beside the project and no fetched cache."""


@dataclass(frozen=True)
class PinnedCrd:
    """One upstream CRD file of the lock."""

    file: str
    repository: str
    path: str
    commit: str
    sha256: str

    def url(self, base: str = GITHUB_RAW) -> str:
        return f"{base.rstrip('/')}/{self.repository}/{self.commit}/{self.path}"

    def check(self, data: bytes, where: str) -> None:
        """Raise unless ``data`` (the content of ``where``) has the pinned sha256."""
        actual = hashlib.sha256(data).hexdigest()
        if actual != self.sha256:
            raise CrdError(
                f"{where}: sha256 {actual}, expected {self.sha256} (pinned in {LOCK_NAME}: {self.repository} "
                f"{self.path} at {self.commit}); replace it with the pinned file ({self.url()}), or update the "
                f"lock's commit and sha256 together when bumping the CRD"
            )


@cache
def lock_bytes() -> bytes:
    return files("serving").joinpath("data", LOCK_NAME).read_bytes()


@cache
def pinned() -> tuple[PinnedCrd, ...]:
    """The lock's entries, in file-name order."""
    entries = json.loads(lock_bytes())["crds"]
    return tuple(sorted((PinnedCrd(**e) for e in entries), key=lambda p: p.file))


def cache_path() -> Path:
    """Where ``fetch`` puts the pinned files: one directory per lock content, so a bumped lock fetches afresh."""
    return cache_dir() / "crds" / hashlib.sha256(lock_bytes()).hexdigest()[:16]


def verify(directory: Path, *, complete: bool) -> None:
    """Check every pinned file in ``directory`` against its sha256; with ``complete``, each must be there."""
    for pin in pinned():
        path = directory / pin.file
        if path.is_file():
            pin.check(path.read_bytes(), str(path))
        elif complete:
            raise CrdError(
                f"{path} is missing: {directory} must hold every CRD pinned in {LOCK_NAME} "
                f"({pin.repository} {pin.path} at {pin.commit}); restore it, or pass --crd-dir DIR"
            )


def _mirror(project: Path | None) -> Path | None:
    if project is None:
        try:
            project = find_project_dir()
        except ProjectNotFoundError as exc:
            raise CrdError(str(exc)) from None
    return (project / MIRROR).resolve() if project is not None else None


def resolve_crd_dir(explicit: Path | None = None, *, project: Path | None = None) -> Path:
    """The verified CRD directory: ``explicit``, else the mirror beside ``project`` (default: the Pulumi project
    directory), else the fetched cache. Raises :class:`NoCrdDirError` when there is none, :class:`CrdError` when the
    one found does not match the lock."""
    if explicit is not None:
        if not explicit.is_dir():
            raise CrdError(
                f"CRD directory {explicit} does not exist; pass --crd-dir with the upstream CRDs pinned in "
                f"{LOCK_NAME} (`python -m serving.pulumi.crds fetch` puts them in {cache_path()})"
            )
        verify(explicit, complete=False)
        return explicit
    mirror = _mirror(project)
    if mirror is not None and mirror.is_dir():
        verify(mirror, complete=True)
        return mirror
    cached = cache_path()
    if cached.is_dir():
        verify(cached, complete=True)
        return cached
    beside = str(mirror) if mirror is not None else "../shared/crds (no Pulumi project found)"
    raise NoCrdDirError(
        f"no CRD directory: no --crd-dir, no {beside}, no fetched cache {cached}; run "
        "`python -m serving.pulumi.crds fetch` (scripts/bootstrap.sh does) to fetch the pinned CRDs, "
        "or pass --crd-dir DIR"
    )


def pinned_crd(name: str) -> dict[str, Any] | None:
    """The pinned upstream CRD ``name`` (``<plural>.<group>``, upstream's file ``<group>_<plural>.yaml``) as the API
    server returns it, from the verified CRD directory; None when there is none (no mirror or cache) or it does not
    pin that CRD."""
    plural, _, group = name.partition(".")
    try:
        path = resolve_crd_dir() / f"{group}_{plural}.yaml"
    except CrdError:
        return None
    if not path.is_file():
        return None
    doc = yaml.load(path.read_text(), Loader=yaml.CSafeLoader)
    return doc if isinstance(doc, dict) else None


def fetch(base_url: str = GITHUB_RAW) -> Path:
    """Download every pinned file into :func:`cache_path`, verifying each sha256; the cache appears whole or not at
    all (files land in a temporary directory renamed into place)."""
    dest = cache_path()
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        for pin in pinned():
            url = pin.url(base_url)
            try:
                with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:  # noqa: S310 (http(s) URL of the lock)
                    data = response.read()
            except (urllib.error.URLError, TimeoutError) as exc:
                if isinstance(exc, urllib.error.HTTPError):
                    reason = f"HTTP {exc.code} {exc.reason}"
                else:
                    reason = str(getattr(exc, "reason", exc))
                raise CrdError(
                    f"cannot fetch {pin.file} from {url}: {reason}; check network access to {base_url}, "
                    "or pass --crd-dir DIR with the pinned CRDs"
                ) from None
            pin.check(data, url)
            (staging / pin.file).write_bytes(data)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(staging, dest)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return dest


def bootstrap(project: Path | None = None, base_url: str = GITHUB_RAW) -> tuple[str, Path]:
    """Make a verified CRD directory available: the mirror or a valid cache as they are, else fetch the cache.
    Returns what was done (``"verified"`` or ``"fetched"``) and the directory."""
    try:
        return "verified", resolve_crd_dir(project=project)
    except NoCrdDirError:
        pass
    except CrdError:
        mirror = _mirror(project)
        if mirror is not None and mirror.is_dir():
            raise  # a broken mirror is for its owner to fix, never silently bypassed
    return "fetched", fetch(base_url)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m serving.pulumi.crds", description=f"Verify or fetch the upstream CRDs pinned in {LOCK_NAME}."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    fetch_cmd = commands.add_parser(
        "fetch", help="Verify ../shared/crds or the cache; fetch the pinned files into the cache when neither is there."
    )
    fetch_cmd.add_argument("--project-dir", type=Path, default=None, help="The Pulumi project directory.")
    fetch_cmd.add_argument("--base-url", default=GITHUB_RAW, help=f"Where the raw files are served [{GITHUB_RAW}].")
    args = parser.parse_args(argv)
    try:
        done, directory = bootstrap(args.project_dir, args.base_url)
    except CrdError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"crds: {done} {len(pinned())} pinned CRDs in {directory}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
