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
| RLDS_OFFLINE  | ``1``: never touch the network, use downloaded files only   |
| RLDS_HF_ENDPOINT | Hugging Face base URL (default https://huggingface.co)  |
| RLDS_HTTP_TIMEOUT | connect and read timeouts in seconds (default 10,60; one value sets both) |
| RLDS_HTTP_RETRIES | retries per mirror after a transient error (default 5)  |
| RLDS_RETRY_BASE_DELAY | first back-off delay in seconds, doubled each retry (default 1) |
| RLDS_HTTP_MIN_SPEED | bytes/s a transfer must average per window, else retried (default 1024; 0: off) |
| RLDS_HTTP_SPEED_WINDOW | seconds of that window (default 60) |
| RLDS_DOWNLOAD_WORKERS | files of one dataset fetched at once (default 4)      |
| RLDS_NUMBA    | ``0``: never use the compiled (numba) kernels, even if installed |
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


def numba_enabled() -> bool:
    """Whether the compiled kernels may be used when numba is installed (``RLDS_NUMBA``, default on)."""
    return _flag("RLDS_NUMBA", True)


def extra_registry_paths() -> list[Path]:
    """Registry files or folders listed in ``$RLDS_REGISTRY``."""
    value = os.environ.get("RLDS_REGISTRY", "")
    return [Path(p).expanduser() for p in value.split(os.pathsep) if p]


def offline() -> bool:
    """Whether the network is off limits (``RLDS_OFFLINE=1``)."""
    return _flag("RLDS_OFFLINE", False)


def hf_endpoint() -> str:
    """Base URL of the Hugging Face Hub (``RLDS_HF_ENDPOINT``; tests point it at a local server)."""
    return os.environ.get("RLDS_HF_ENDPOINT", "").rstrip("/") or "https://huggingface.co"


def _number(name: str, default: float, minimum: float = 0.0) -> float:
    value = os.environ.get(name, "").strip()
    try:
        return max(minimum, float(value)) if value else default
    except ValueError:
        return default


def http_timeout() -> tuple[float, float]:
    """(connect, read) timeouts in seconds: ``RLDS_HTTP_TIMEOUT`` as ``10,60`` or one number."""
    parts = [p for p in os.environ.get("RLDS_HTTP_TIMEOUT", "").split(",") if p.strip()]
    try:
        values = [max(0.01, float(p)) for p in parts]
    except ValueError:
        values = []
    if len(values) == 1:
        return values[0], values[0]
    return (values[0], values[1]) if len(values) == 2 else (10.0, 60.0)


def http_retries() -> int:
    """Retries per mirror after a transient error (``RLDS_HTTP_RETRIES``, default 5)."""
    return int(_number("RLDS_HTTP_RETRIES", 5))


def retry_base_delay() -> float:
    """First back-off delay in seconds (``RLDS_RETRY_BASE_DELAY``, default 1; doubled per retry)."""
    return _number("RLDS_RETRY_BASE_DELAY", 1.0)


def http_min_speed() -> float:
    """Bytes per second a transfer must average over each speed window (``RLDS_HTTP_MIN_SPEED``,
    default 1024; 0 turns the rule off): a slower one is cut and retried."""
    return _number("RLDS_HTTP_MIN_SPEED", 1024.0)


def http_speed_window() -> float:
    """Seconds over which the minimum speed is measured (``RLDS_HTTP_SPEED_WINDOW``, default 60)."""
    return _number("RLDS_HTTP_SPEED_WINDOW", 60.0, minimum=0.01)


def download_workers() -> int:
    """How many files of one dataset download at once (``RLDS_DOWNLOAD_WORKERS``, default 4)."""
    return int(_number("RLDS_DOWNLOAD_WORKERS", 4, minimum=1))
