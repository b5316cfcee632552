"""Settings read from the environment, in one place, at call time.

Order of precedence everywhere: explicit argument > CLI flag > ``RLDS_*`` variable > default.
Variables are read when a function needs them (never at import), so tests and long-lived
processes can change them.

| variable      | meaning                                                   |
|---------------|-----------------------------------------------------------|
| RLDS_HOME     | cache root (default: the platform user cache dir)         |
| RLDS_DEBUG    | ``1`` makes the CLI print full tracebacks                  |
| RLDS_REGISTRY | extra registry files or folders, ``os.pathsep``-separated   |
| RLDS_FSYNC    | ``0`` skips fsync before publishing (faster, less durable) |
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "rlds"


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() not in {"0", "false", "no", "off"}


def cache_root(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Return the cache root: ``explicit`` > ``$RLDS_HOME`` > the platform user cache dir."""
    if explicit is not None and str(explicit) != "":
        return Path(explicit).expanduser()
    env = os.environ.get("RLDS_HOME")
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_cache_dir(APP_NAME))


def debug() -> bool:
    """Whether full tracebacks were asked for (``RLDS_DEBUG=1``)."""
    return _flag("RLDS_DEBUG", False)


def fsync_enabled() -> bool:
    """Whether files are fsynced before a dataset is published (``RLDS_FSYNC``, default on)."""
    return _flag("RLDS_FSYNC", True)


def extra_registry_paths() -> list[Path]:
    """Registry files or folders listed in ``$RLDS_REGISTRY``."""
    value = os.environ.get("RLDS_REGISTRY", "")
    return [Path(p).expanduser() for p in value.split(os.pathsep) if p]
