"""One Gen-DGRL trajectory file -> its dict of arrays: a ``.npy`` of a pickled dict (read by
the restricted unpickler of :mod:`rlds_cli.formats.safe_pickle` unless ``allow_pickle``) or an
``.npz`` (each array streamed and checked), from an archive member's bytes or a loose file."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any, cast

import numpy as np

from rlds_cli.errors import SourceFormatError, SourceNotReadableError
from rlds_cli.formats.gen_dgrl.files import REQUIRED_KEYS, TRAJECTORY_KEYS
from rlds_cli.formats.npz_util import NpyStream, npz_keys, open_npz
from rlds_cli.formats.safe_pickle import unpickle
from rlds_cli.formats.untrusted import UnsafeSourceError, require_rows

#: Largest trajectory member or loose ``.npy`` read (it is held in memory while decoded, so this
#: bounds what one member can make rlds allocate). A Procgen episode of 1,000 steps (the games'
#: time limit) of float32 frames is about 50 MB.
MAX_MEMBER_BYTES = 1 << 30


def _load_npy(data: bytes, where: str, allow_pickle: bool) -> Any:
    """A ``.npy`` holding a pickled object (``np.save(f, dict)``) -> the object."""
    fh = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(fh)
        read_header = (
            np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        )
        shape, _, dtype = read_header(fh)
    except (ValueError, EOFError, OSError) as exc:
        raise SourceFormatError(f"{where}: not a readable .npy file (truncated or corrupt?): {exc}") from exc
    if not dtype.hasobject or shape != ():
        raise SourceFormatError(
            f"{where}: holds an array of shape {tuple(shape)} ({dtype}), not a pickled dict of one "
            f"trajectory ({TRAJECTORY_KEYS})",
            hint="Gen-DGRL .npy files are written by np.save(f, {'observations': ..., ...})",
        )
    obj = unpickle(fh, where, allow_pickle)
    # numpy pickles the 0-d object array itself; its one element is the dict (TorchRL's .tolist())
    return obj.item() if isinstance(obj, np.ndarray) and obj.shape == () and obj.dtype.hasobject else obj


def _load_npz(zf: zipfile.ZipFile, where: str) -> dict[str, np.ndarray | None]:
    """Every array of an ``.npz`` (streamed and checked by :class:`NpyStream`)."""
    for info in zf.infolist():
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            # Python inflates bzip2 and LZMA members without an output bound
            raise UnsafeSourceError(
                f"{where}: array {info.filename!r} uses zip compression method {info.compress_type} (only "
                "stored and deflated arrays are read, as np.savez and np.savez_compressed write them)"
            )
    keys = npz_keys(zf)
    out: dict[str, np.ndarray | None] = {k: None for k in keys if k not in REQUIRED_KEYS}  # not stored
    label = cast(Path, where)  # NpyStream only prints it
    for key in (k for k in REQUIRED_KEYS if k in keys):
        stream = NpyStream(zf, key, label)
        try:
            require_rows(where, key, stream.shape)
            out[key] = stream.read(stream.shape[0])
        finally:
            stream.close()
    return out


def _npz_from_bytes(data: bytes, where: str) -> dict[str, np.ndarray | None]:
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise SourceFormatError(
            f"{where}: not a readable .npz (zip) file (truncated or corrupt?): {exc}"
        ) from exc
    with zf:
        return _load_npz(zf, where)


def decode_member(kind: str, data: bytes, where: str, allow_pickle: bool) -> Any:
    return _load_npy(data, where, allow_pickle) if kind == ".npy" else _npz_from_bytes(data, where)


def read_loose(path: Path, allow_pickle: bool) -> Any:
    """A loose trajectory file -> its dict of arrays."""
    kind = path.suffix.lower()
    if kind == ".npz":
        zf = open_npz(path)
        with zf:
            return _load_npz(zf, str(path))
    size = path.stat().st_size
    if size > MAX_MEMBER_BYTES:
        raise UnsafeSourceError(
            f"{path}: {size:,} bytes, over the {MAX_MEMBER_BYTES:,} a trajectory file may take "
            "(it is read whole)"
        )
    try:
        data = path.read_bytes()
    except PermissionError as exc:
        raise SourceNotReadableError(f"cannot read source file {path}: permission denied") from exc
    return _load_npy(data, str(path), allow_pickle)
