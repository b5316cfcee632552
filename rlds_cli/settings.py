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
| RLDS_HF_ENDPOINT | Hugging Face base URL (default ``HF_ENDPOINT``, else https://huggingface.co) |
| RLDS_HTTP_TIMEOUT | connect and read timeouts in seconds (default 10,60; one value sets both) |
| RLDS_HTTP_RETRIES | retries per mirror after a transient error (default 5)  |
| RLDS_RETRY_BASE_DELAY | first back-off delay in seconds, doubled each retry (default 1) |
| RLDS_HTTP_MIN_SPEED | bytes/s a transfer must average per window, else retried (default 1024; 0: off) |
| RLDS_HTTP_SPEED_WINDOW | seconds of that window (default 60) |
| RLDS_DOWNLOAD_WORKERS | files of one dataset fetched at once (default 4)      |
| RLDS_NUMBA    | ``0``: never use the compiled (numba) kernels, even if installed |
| RLDS_MEMORY_BUDGET | bytes a loader copies into RAM by itself (``2G``; 0: never) |
| RLDS_SEED     | the seed of loaders given none (the same on every rank)    |
| RLDS_REMOTE_CACHE | folder of the local copy of remote datasets' chunks     |
| RLDS_REMOTE_CACHE_LIMIT | bytes that folder may hold (``20G``): blocks, evicted LRU |
| RLDS_ARCHIVE_MAX_BYTES | largest total an archive may unpack to (default 256G) |
| RLDS_ARCHIVE_MAX_RATIO | largest unpacked/read ratio of an archive (default 200) |
| RLDS_SOURCE_MAX_RATIO | largest declared/stored ratio of a source array (default 100) |
| RLDS_SIDE_ARRAY_MAX_BYTES | largest side array read whole (default 64M) |

A value that cannot be used (not a number, a size or a seed, or out of range) is one
:class:`~rlds_cli.errors.SettingError` naming the variable, never a silent default.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import platformdirs

from rlds_cli.errors import SettingError

APP_NAME = "rlds"


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _flag(name: str, default: bool) -> bool:
    """An on/off variable: ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off`` (any
    case); unset or empty is ``default``, anything else a :class:`SettingError` (``maybe`` was on)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if raw.lower() in _TRUE | _FALSE:
        return raw.lower() in _TRUE
    raise _bad(name, raw, "1 or 0 (on or off)")


def cache_root(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Return the cache root: ``explicit`` > ``$RLDS_HOME`` > the platform user cache dir."""
    if explicit is not None and str(explicit) != "":
        return _expanded(Path(explicit), "--root")
    env = os.environ.get("RLDS_HOME")
    if env:
        return _expanded(Path(env), "RLDS_HOME")
    return Path(platformdirs.user_cache_dir(APP_NAME))


def _expanded(path: Path, given: str) -> Path:
    """``path`` with ``~``/``~user`` expanded; a user without a home folder is a :class:`SettingError`."""
    try:
        return path.expanduser()
    except RuntimeError:  # Path.expanduser: "Could not determine home directory."
        raise SettingError(
            f"{given} is {str(path)!r}, whose home folder ({path.parts[0]}) is unknown on this machine",
            hint="give the cache root as a path without ~user",
        ) from None


def debug() -> bool:
    """Whether full tracebacks were asked for (``RLDS_DEBUG=1``)."""
    return _flag("RLDS_DEBUG", False)


def fsync_enabled() -> bool:
    """Whether files are fsynced before a dataset is published (``RLDS_FSYNC``, default on)."""
    return _flag("RLDS_FSYNC", True)


def numba_enabled() -> bool:
    """Whether the compiled kernels may be used when numba is installed (``RLDS_NUMBA``, default on)."""
    return _flag("RLDS_NUMBA", True)


def check_flags() -> None:
    """Read every on/off variable once, so a bad value is refused before a command starts
    rather than midway (``RLDS_FSYNC=maybe`` at publish time).

    Raises:
        SettingError: One of them holds neither on nor off.
    """
    debug(), fsync_enabled(), numba_enabled(), offline()


def extra_registry_paths() -> list[Path]:
    """Registry files or folders listed in ``$RLDS_REGISTRY``."""
    value = os.environ.get("RLDS_REGISTRY", "")
    return [Path(p).expanduser() for p in value.split(os.pathsep) if p]


def offline() -> bool:
    """Whether the network is off limits (``RLDS_OFFLINE=1``)."""
    return _flag("RLDS_OFFLINE", False)


def _bad(name: str, raw: str, want: str) -> SettingError:
    return SettingError(f"{name}={raw!r} is not {want}", hint=f"unset {name}, or set it to {want}")


def _parse_number(name: str, raw: str, minimum: float) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < minimum:
        raise _bad(name, raw, f"a number >= {minimum:g}")
    return value


def _number(name: str, default: float, minimum: float = 0.0) -> float:
    raw = os.environ.get(name, "").strip()
    return _parse_number(name, raw, minimum) if raw else default


_SIZE_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _size(name: str, default: int | None) -> int | None:
    """Bytes: a number, or one with a K, M, G or T suffix (``2G``, ``512MiB``)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    return size_value(name, raw)


def size_value(name: str, raw: str | int) -> int:
    """``raw`` as bytes: an int, or a string of a number with an optional K, M, G or T suffix
    (``"20G"``, ``"500MiB"``, ``"1.5T"``; powers of 1024). ``name`` is what the error names (a
    variable or an argument).

    Raises:
        SettingError: ``raw`` is no such size, or negative.
    """
    if isinstance(raw, int) and not isinstance(raw, bool):
        if raw < 0:
            raise _bad(name, str(raw), "a size: bytes, or a number with K, M, G or T (e.g. 2G)")
        return raw
    if not isinstance(raw, str):
        raise _bad(name, repr(raw), "a size: bytes, or a number with K, M, G or T (e.g. 2G)")
    raw = raw.strip()
    number, suffix = raw.upper().removesuffix("IB").removesuffix("B"), ""
    if number and number[-1] in _SIZE_SUFFIXES:
        number, suffix = number[:-1], number[-1]
    try:
        value = float(number) * _SIZE_SUFFIXES[suffix]
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise _bad(name, raw, "a size: bytes, or a number with K, M, G or T (e.g. 2G)")
    return int(value)


def http_timeout() -> tuple[float, float]:
    """(connect, read) timeouts in seconds: ``RLDS_HTTP_TIMEOUT`` as ``10,60`` or one number."""
    raw = os.environ.get("RLDS_HTTP_TIMEOUT", "").strip()
    if not raw:
        return 10.0, 60.0
    parts = raw.split(",")
    if len(parts) > 2:
        raise _bad("RLDS_HTTP_TIMEOUT", raw, "one number of seconds, or two (connect,read)")
    values = [_parse_number("RLDS_HTTP_TIMEOUT", p.strip(), 0.01) for p in parts]
    return (values[0], values[-1])


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


def memory_budget() -> int | None:
    """Bytes a loader may copy into RAM by itself (``RLDS_MEMORY_BUDGET``; ``None``: unset)."""
    return _size("RLDS_MEMORY_BUDGET", None)


def seed() -> int | None:
    """The seed of loaders given none (``RLDS_SEED``; ``None``: unset)."""
    raw = os.environ.get("RLDS_SEED", "").strip()
    if not raw:
        return None
    if not (raw.isascii() and raw.isdigit()) or int(raw) >= 2**63:  # "²".isdigit(); int() refuses it
        raise _bad("RLDS_SEED", raw, "an integer from 0 to 2**63 - 1 such as 1234")
    return int(raw)


def hf_endpoint() -> str:
    """The Hugging Face Hub's base URL, without a trailing slash: ``RLDS_HF_ENDPOINT``, else
    ``HF_ENDPOINT``, else https://huggingface.co.

    Raises:
        SettingError: The variable set is not an http(s) URL with a host (``notaurl`` was tried
            as an address and reported as a network failure).
    """
    from urllib.parse import urlsplit

    for name in ("RLDS_HF_ENDPOINT", "HF_ENDPOINT"):
        raw = os.environ.get(name, "").strip()
        if raw:
            parts = urlsplit(raw)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise _bad(name, raw, "an http(s) URL such as https://huggingface.co")
            return raw.rstrip("/")
    return "https://huggingface.co"


def remote_cache() -> str | None:
    """Folder for the local copy of remote datasets' chunks (``RLDS_REMOTE_CACHE``)."""
    return os.environ.get("RLDS_REMOTE_CACHE", "").strip() or None


def remote_cache_limit() -> int | None:
    """Bytes the remote cache folder may hold (``RLDS_REMOTE_CACHE_LIMIT``; ``None``: unset,
    whole files are kept without a limit)."""
    return _size("RLDS_REMOTE_CACHE_LIMIT", None)


def archive_max_bytes() -> int:
    """Largest total an archive may unpack to (``RLDS_ARCHIVE_MAX_BYTES``, default 256 GiB)."""
    return int(_size("RLDS_ARCHIVE_MAX_BYTES", 256 << 30) or 0)


def archive_max_ratio(default: float) -> float:
    """Largest ratio of bytes unpacked to archive bytes read (``RLDS_ARCHIVE_MAX_RATIO``)."""
    return _number("RLDS_ARCHIVE_MAX_RATIO", default, minimum=1.0)


def source_max_ratio(default: float) -> float:
    """Largest declared/stored ratio of one source array (``RLDS_SOURCE_MAX_RATIO``)."""
    return _number("RLDS_SOURCE_MAX_RATIO", default, minimum=1.0)


def side_array_max_bytes(default: int) -> int:
    """Largest side array read whole (``RLDS_SIDE_ARRAY_MAX_BYTES``)."""
    return int(_size("RLDS_SIDE_ARRAY_MAX_BYTES", default) or 0)
