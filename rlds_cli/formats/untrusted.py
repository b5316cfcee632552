"""Rules for untrusted source files: what a downloaded file may make rlds read, allocate or write,
and bounded reads of JSON metadata files.

Every reader applies these rules before it reads data (``docs/formats.md``, "Untrusted input";
archives: :mod:`rlds_cli.formats.archives`):

* **Numeric arrays only.** Observations, actions, rewards and done flags must be bool, integer,
  float or complex arrays with one row per step (:func:`require_numeric`, :func:`require_rows`).
  Strings, objects, compound records, void bytes and dates are refused, naming file and key;
  only per-step *info* text columns are dropped with a note.
* **Declared sizes must be backed by data.** An array declaring more than
  :data:`RATIO_FLOOR_BYTES` and more than ``RLDS_SOURCE_MAX_RATIO`` (default 100) times the bytes
  the file stores for it (a gzip stream of zeros, unwritten HDF5 chunks, an inflating ``.npz``
  member) is refused before anything is allocated or written (:func:`check_declared`).
* **Side arrays are small.** Arrays that are not per step (D4RL ``metadata/*``, arrays of another
  length), kept whole in the manifest or ``source_metadata.npz``, may declare at most
  ``RLDS_SIDE_ARRAY_MAX_BYTES`` each (default 64 MiB, :func:`check_side_array`).

JSON metadata files (LeRobot's ``info.json``, TFDS's ``features.json``, TensorDict's
``meta.json``, Minari's ``metadata.json``) are size-bounded, parsed, and fail with one error
naming the file (:func:`read_json_file`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli import settings
from rlds_cli.cache.ted import describe_dtype, is_numeric
from rlds_cli.errors import SourceFormatError

__all__ = ["MAX_JSON_BYTES", "check_json_size", "read_json_file"]

#: Below this many declared bytes an array is never called a bomb (small all-zero columns, such
#: as a bool ``terminals``, compress extremely well).
RATIO_FLOOR_BYTES = 64 << 20
#: Default largest ratio of declared bytes to stored bytes for one array above the floor.
DEFAULT_MAX_RATIO = 100.0
#: Default largest side array (not per step) read whole.
DEFAULT_SIDE_ARRAY_MAX_BYTES = 64 << 20


class UnsafeSourceError(SourceFormatError):
    """A source file that points at data outside itself (HDF5 external or soft links, external raw
    storage, virtual datasets), declares far more data than it holds (a decompression bomb, a sparse
    dataset), or has a side array over the size limit."""

    default_hint = (
        "the file is malicious or broken: get it from a trusted source; rlds reads only data stored "
        "in the file itself"
    )


def max_ratio() -> float:
    """Largest declared/stored ratio of one source array (``RLDS_SOURCE_MAX_RATIO``, default 100)."""
    return settings.source_max_ratio(DEFAULT_MAX_RATIO)


def side_array_max_bytes() -> int:
    """Largest side array read whole (``RLDS_SIDE_ARRAY_MAX_BYTES``, default 64 MiB)."""
    return settings.side_array_max_bytes(DEFAULT_SIDE_ARRAY_MAX_BYTES)


def declared_bytes(shape: Sequence[int], dtype: np.dtype) -> int:
    """In-memory bytes of an array of ``shape`` and ``dtype``, as a Python int (a hostile shape cannot
    wrap around as in int64 ``np.prod``)."""
    count = 1
    for dim in shape:
        count *= int(dim)
    return count * max(np.dtype(dtype).itemsize, 1)


def check_declared(where: object, key: str, declared: int, stored: int, *, how: str = "stores") -> None:
    """Refuse an array that declares far more bytes than the file holds for it.

    Args:
        where: The source file (named in the message).
        key: The array's name in the source.
        declared: Bytes the array takes once read (:func:`declared_bytes`).
        stored: Bytes the file stores for it (compressed size, allocated HDF5 storage).
        how: Verb for the message (``"stores"``, ``"compresses into"``).

    Raises:
        UnsafeSourceError: Over :data:`RATIO_FLOOR_BYTES` and over :func:`max_ratio` times
            ``stored``.
    """
    if declared <= RATIO_FLOOR_BYTES:  # the common case, without reading the environment
        return
    ratio = max_ratio()
    if declared > ratio * max(stored, 1):
        raise UnsafeSourceError(
            f"{where}: {key!r} declares {declared:,} bytes but the file {how} only {stored:,} for it "
            f"(ratio over {ratio:g}); refusing (a decompression bomb or a sparse dataset?)",
            hint="if you trust the file, raise RLDS_SOURCE_MAX_RATIO (declared/stored bytes per array)",
        )


def check_side_array(where: object, key: str, shape: Sequence[int], dtype: np.dtype) -> None:
    """Refuse a side array (not per step, read whole) over :func:`side_array_max_bytes`."""
    # variable-length values (strings, ragged arrays) count at least a pointer each
    dtype = np.dtype(dtype)
    nbytes = declared_bytes(shape, dtype if dtype.kind != "O" else np.dtype((np.void, 16)))
    limit = side_array_max_bytes()
    if nbytes > limit:
        raise UnsafeSourceError(
            f"{where}: {key!r} is a side array (not one row per step) of shape {tuple(shape)} taking "
            f"{nbytes:,} bytes, over the limit of {limit:,} for arrays read whole",
            hint="if you trust the file and want the array kept, raise RLDS_SIDE_ARRAY_MAX_BYTES",
        )


def require_numeric(where: object, key: str, dtype: np.dtype) -> None:
    """Refuse a step array (observation, action, reward, flag, info) that is not numeric.

    Raises:
        SourceFormatError: Naming ``where`` and ``key`` and what the values are.
    """
    if not is_numeric(dtype):
        raise SourceFormatError(
            f"{where}: {key!r} holds {describe_dtype(dtype)}; rlds stores numeric arrays only "
            "(bool, integers, floats)",
            hint="convert the array to numbers (e.g. floats) and write the file again",
        )


def require_shape(where: object, key: str, shape: object) -> tuple[int, ...]:
    """A declared shape as a tuple of non-negative integers; anything else is refused."""
    if not isinstance(shape, list | tuple) or not all(
        isinstance(d, int | np.integer) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise SourceFormatError(
            f"{where}: {key!r} declares the shape {shape!r}, which is not a list of sizes >= 0",
            hint="the file is damaged or was not written by the format's library",
        )
    return tuple(int(d) for d in shape)


def require_rows(where: object, key: str, shape: Sequence[int]) -> None:
    """Refuse a step array without a row axis (a 0-d scalar where one row per step is needed)."""
    if len(shape) == 0:
        raise SourceFormatError(
            f"{where}: {key!r} is a single value (0-d), not an array with one row per step",
            hint="the file is not in the format's layout; check it, or pass --format for another format",
        )


#: Largest JSON metadata file read (refused before any of it is read).
MAX_JSON_BYTES = 64 << 20


def check_json_size(path: Path, what: str = "metadata") -> None:
    """Refuse ``path`` where it is over :data:`MAX_JSON_BYTES`; ``what`` names it in the error.

    Raises:
        SourceFormatError: ``<path> is <n> bytes, over the <max> read for <what>``.
        OSError: ``path`` cannot be stat'ed.
    """
    size = path.stat().st_size
    if size > MAX_JSON_BYTES:
        raise SourceFormatError(f"{path} is {size:,} bytes, over the {MAX_JSON_BYTES:,} read for {what}")


def read_json_file(path: Path, what: str = "metadata") -> Any:
    """The JSON file at ``path``, parsed (any JSON value: the caller checks its shape).

    Raises:
        SourceFormatError: It is over :data:`MAX_JSON_BYTES` (:func:`check_json_size`), or
            missing, unreadable, not UTF-8 or not JSON (``<path> is not readable JSON: <why>``).
    """
    try:
        check_json_size(path, what)
        return json.loads(path.read_text(encoding="utf-8"))
    except SourceFormatError:
        raise
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise SourceFormatError(f"{path} is not readable JSON: {exc}") from None
