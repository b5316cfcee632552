"""Small h5py helpers shared by the HDF5-based readers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.errors import SourceFormatError, SourceNotFoundError

#: Arrays at most this many elements go into the manifest as JSON; larger ones into an npz.
SMALL_ARRAY_ELEMENTS = 16


def open_hdf5(path: Path) -> Any:
    """Open an HDF5 file read-only, turning h5py's errors into one-line rlds errors."""
    import h5py

    if not path.exists():
        raise SourceNotFoundError(f"source file {path} does not exist")
    try:
        return h5py.File(path, "r")
    except OSError as exc:
        raise SourceFormatError(
            f"cannot open {path} as HDF5 (truncated or corrupt?): {_first_line(exc)}",
            hint="re-download the file ('rlds download ID --force') or check that it is HDF5",
        ) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def read_error(path: Path, key: str, exc: BaseException) -> SourceFormatError:
    """The error for an HDF5 read that fails midway (a damaged or truncated file)."""
    return SourceFormatError(
        f"{path}: reading {key!r} failed (file truncated or corrupt?): {_first_line(exc)}",
        hint="re-download the file ('rlds download ID --force')",
    )


def to_jsonable(value: Any) -> Any:
    """Decode an HDF5 scalar/attribute into something ``json.dumps`` accepts."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "SO":
            return [to_jsonable(v) for v in value.ravel().tolist()]
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def collect_metadata(group: Any, prefix: str, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Walk an HDF5 group: attributes, scalars and small arrays into ``meta``; larger arrays
    into ``arrays``. Keys are ``/``-joined paths below ``prefix``."""
    import h5py

    for attr, value in group.attrs.items():
        meta[f"{prefix}@{attr}" if prefix else f"@{attr}"] = to_jsonable(value)

    def visit(name: str, obj: Any) -> None:
        path = f"{prefix}/{name}" if prefix else name
        for attr, value in obj.attrs.items():
            meta[f"{path}@{attr}"] = to_jsonable(value)
        if isinstance(obj, h5py.Dataset):
            if obj.shape == () or obj.size <= SMALL_ARRAY_ELEMENTS or obj.dtype.kind in "SOU":
                meta[path] = to_jsonable(obj[()])
            else:
                arrays[path] = np.asarray(obj[()])

    group.visititems(visit)
