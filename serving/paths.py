"""Where ExaServe reads and writes outside the package: the Pulumi project, the state directory, the cache.

The package never reads its own checkout at run time; every path comes from here:

* the **project directory** (``Pulumi.yaml`` and its ``Pulumi.<stack>.yaml`` files): ``$EXASERVE_PROJECT_DIR``,
  else the nearest directory at or above the current one holding ``Pulumi.yaml`` (as ``pulumi`` looks it up);
* the **state directory** (rollout journals, locks, sandbox records, reports): ``--state-dir``, else
  ``$EXASERVE_STATE_DIR``, else ``$XDG_STATE_HOME/exaserve`` (``~/.local/state/exaserve``);
* the **cache directory** (fetched CRDs): ``$XDG_CACHE_HOME/exaserve`` (``~/.cache/exaserve``).
"""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ENV = "EXASERVE_PROJECT_DIR"
STATE_ENV = "EXASERVE_STATE_DIR"
PROJECT_FILE = "Pulumi.yaml"
APP = "exaserve"


class ProjectNotFoundError(Exception):
    """No Pulumi project directory; the message says where it looked and how to point at one."""


class MissingFileError(ValueError):
    """A file the user named does not exist; the message names the flag, the path and what the file is for."""


def require_file(path: Path | None, flag: str, why: str) -> None:
    """:class:`MissingFileError` unless ``path`` (when given) is an existing file; ``why`` says what it is for."""
    if path is not None and not path.is_file():
        raise MissingFileError(f"{flag} {path}: no such file; {why}")


def _xdg(var: str, default: str) -> Path:
    """An XDG base directory: ``$var`` when set to an absolute path (the spec ignores relative ones), else the default."""
    value = os.environ.get(var, "")
    return Path(value) if value and Path(value).is_absolute() else Path.home() / default


def find_project_dir(start: Path | None = None) -> Path | None:
    """The Pulumi project directory, or None: ``$EXASERVE_PROJECT_DIR``, else the nearest ``Pulumi.yaml`` upwards."""
    env = os.environ.get(PROJECT_ENV)
    if env:
        path = Path(env).expanduser().absolute()
        if not (path / PROJECT_FILE).is_file():
            raise ProjectNotFoundError(
                f"{PROJECT_ENV}={env} has no {PROJECT_FILE}; point it at the directory holding the Pulumi project "
                "(Pulumi.yaml and the Pulumi.<stack>.yaml files) or unset it"
            )
        return path
    here = (start or Path.cwd()).absolute()
    return next((d for d in (here, *here.parents) if (d / PROJECT_FILE).is_file()), None)


def project_dir(start: Path | None = None) -> Path:
    """The Pulumi project directory (see :func:`find_project_dir`); raises when there is none."""
    found = find_project_dir(start)
    if found is None:
        here = (start or Path.cwd()).absolute()
        raise ProjectNotFoundError(
            f"no Pulumi project: neither {here} nor a directory above it holds {PROJECT_FILE}, and {PROJECT_ENV} "
            "is not set; pass --stack-file PATH, run inside the project, or set "
            f"{PROJECT_ENV}=DIR"
        )
    return found


def state_dir(explicit: Path | None = None) -> Path:
    """Root of every stack's state: ``explicit`` (``--state-dir``), ``$EXASERVE_STATE_DIR``, ``$XDG_STATE_HOME/exaserve``."""
    if explicit is not None:
        return explicit
    env = os.environ.get(STATE_ENV)
    return Path(env) if env else _xdg("XDG_STATE_HOME", ".local/state") / APP


def cache_dir() -> Path:
    """ExaServe's cache: ``$XDG_CACHE_HOME/exaserve`` (``~/.cache/exaserve``)."""
    return _xdg("XDG_CACHE_HOME", ".cache") / APP
