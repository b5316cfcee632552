"""Small h5py helpers shared by the HDF5-based readers."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.errors import SourceFormatError, SourceNotFoundError, SourceNotReadableError
from rlds_cli.formats import untrusted

#: File name suffixes of HDF5 sources.
HDF5_SUFFIXES = (".hdf5", ".h5")
#: Arrays at most this many elements go into the manifest as JSON; larger ones into an npz.
SMALL_ARRAY_ELEMENTS = 16
#: Deepest group nesting accepted in a source file (real files nest a few levels).
MAX_DEPTH = 64


def is_hdf5_name(path: Path) -> bool:
    """Whether ``path`` is named like an HDF5 file (and is no folder)."""
    return path.name.lower().endswith(HDF5_SUFFIXES) and not path.is_dir()


def hdf5_top_keys(path: Path) -> tuple[str, ...] | None:
    """The names at the root of an HDF5 file, or ``None`` when it will not open: what the
    format sniffers look at (remembered per file version, as several sniffers ask in turn)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return _top_keys(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=64)
def _top_keys(path: str, mtime_ns: int, size: int) -> tuple[str, ...] | None:
    import h5py

    try:
        with h5py.File(path, "r") as f:
            return tuple(f.keys())
    except OSError:
        return None


def open_hdf5(path: Path, *, check_datasets: bool = True) -> Any:
    """Open an HDF5 file read-only, turning h5py's errors into one-line rlds errors, and check
    it with :func:`check_tree` (no links out of the file, no bombs) before any data is read.

    Args:
        path: The file.
        check_datasets: Also check every dataset's storage up front. A reader that opens
            thousands of small datasets itself (Minari) passes ``False`` and calls
            :func:`check_dataset` on each one it reads instead, which costs less than opening
            each twice.
    """
    import h5py

    if not path.exists():
        raise SourceNotFoundError(f"source file {path} does not exist")
    try:
        f = h5py.File(path, "r")
    except PermissionError as exc:
        raise SourceNotReadableError(f"cannot read source file {path}: permission denied") from exc
    except OSError as exc:
        raise SourceFormatError(
            f"cannot open {path} as HDF5 (truncated or corrupt?): {_first_line(exc)}",
            hint="re-download the file ('rlds download ID --force') or check that it is HDF5",
        ) from exc
    try:
        check_tree(f, path, check_datasets=check_datasets)
    except BaseException:
        f.close()
        raise
    return f


def check_tree(f: Any, path: Path, *, check_datasets: bool = True) -> None:
    """Refuse an HDF5 file that would make rlds read anything but its own bytes, or far more
    data than it holds (the rules of :mod:`rlds_cli.formats.untrusted`).

    Every link of the file is looked at once, without reading data:

    * external links (data in another file, any file the user can read), soft links (which can
      also form cycles) and user-defined links are refused: every object must be reached by
      hard links only;
    * an object reached by two hard links (a group linked into itself makes a cycle) is refused;
    * groups nested deeper than :data:`MAX_DEPTH` levels are refused;
    * with ``check_datasets``, every dataset is checked by :func:`check_dataset`.

    Raises:
        UnsafeSourceError: Naming the file, the HDF5 path and what it points at.
    """
    from h5py import h5d, h5l

    problems: list[str] = []
    seen: dict[int, bytes] = {}  # object address -> the first link that reached it
    hard = h5l.TYPE_HARD

    # (an exception raised inside an h5py visitor surfaces as a SystemError: the visitor only
    # records, and returning anything but None stops the visit)
    def link(name: bytes, info: Any) -> int | None:
        if info.type == hard:
            first = seen.setdefault(info.u, name)
            if first != name:
                problems.append(
                    f"{_text(name)!r} links to the same object as {_text(first)!r} (linked twice: a cycle?)"
                )
            elif name.count(b"/") >= MAX_DEPTH:
                problems.append(f"{_text(name)[:80]!r}... is nested more than {MAX_DEPTH} groups deep")
        elif info.type == h5l.TYPE_EXTERNAL:
            target_file, target = f.id.links.get_val(name)
            problems.append(
                f"{_text(name)!r} is an external link (to {_text(target)!r} in {_text(target_file)})"
            )
        elif info.type == h5l.TYPE_SOFT:
            problems.append(f"{_text(name)!r} is a soft link (to {_text(f.id.links.get_val(name))!r})")
        else:
            problems.append(f"{_text(name)!r} is a user-defined link (type {info.type})")
        return 1 if problems else None

    f.id.links.visit(link, info=True)
    if problems:
        raise untrusted.UnsafeSourceError(
            f"{path}: {problems[0]}; rlds reads only data stored in the file itself, reached by hard links"
        )
    if check_datasets:
        for name in seen.values():
            try:
                dsid = h5d.open(f.id, name)
            except (KeyError, ValueError, TypeError):  # a group, or a named datatype
                continue
            check_dataset(path, _text(name), dsid)


def check_dataset(
    path: Path, name: str, dsid: Any, shape: tuple[int, ...] | None = None, dtype: Any = None
) -> None:
    """Refuse one HDF5 dataset (an ``h5py.h5d.DatasetID``) whose data is not in the file itself
    (external raw storage, a virtual layout mapping other files), or whose declared size is far
    over the bytes the file stores for it (:func:`untrusted.check_declared`), or past the end of
    the file.

    ``shape`` and ``dtype`` may be passed by a caller that has them already (each costs a call
    into HDF5, which adds up over thousands of small datasets).

    Raises:
        UnsafeSourceError: Naming the file and the dataset.
    """
    from h5py import h5d

    shape = dsid.shape if shape is None else shape
    try:
        dtype = dsid.dtype if dtype is None else dtype
    except (TypeError, ValueError) as exc:  # an HDF5 type with no numpy equivalent
        raise SourceFormatError(
            f"{path}: dataset {name!r} has an HDF5 type that numpy cannot hold ({_first_line(exc)})"
        ) from exc
    declared = untrusted.declared_bytes(shape or (), dtype)
    problem = None
    try:
        stored = int(dsid.get_storage_size())
        offset = dsid.get_offset()
        if offset is not None:  # contiguous data inside this file (the cheap, common case)
            # a small array is harmless even if its header lies (the read then fails cleanly)
            if declared > untrusted.RATIO_FLOOR_BYTES and offset + stored > os.path.getsize(path):
                problem = f"claims {stored:,} bytes at offset {offset:,}, past the end of the file"
        else:  # chunked, compact, external or virtual: look at the layout
            plist = dsid.get_create_plist()
            if plist.get_layout() == h5d.VIRTUAL:
                problem, stored = _virtual_problem(dsid, plist)
            elif plist.get_external_count() > 0:
                problem = f"keeps its data in an external file ({_text(plist.get_external(0)[0])})"
    except (RuntimeError, OSError) as exc:  # h5py on a damaged header: "bad coordinate offset"
        raise read_error(path, name, exc) from exc
    if problem is not None:
        raise untrusted.UnsafeSourceError(
            f"{path}: dataset {name!r} {problem}; rlds reads only data stored in the file itself"
        )
    untrusted.check_declared(path, name, declared, stored)


def _virtual_problem(dsid: Any, plist: Any) -> tuple[str | None, int]:
    """A virtual dataset may map datasets of its own file only (source file ``.``, what h5py
    writes for a source in the same file; D4RL's CARLA files are built that way): what is wrong
    with it, or ``None`` and the bytes its distinct sources store (so a mapping that repeats one
    small source, or leaves most of the array to the fill value, counts as a bomb)."""
    import h5py
    from h5py import h5d

    sources: set[bytes] = set()
    for i in range(plist.get_virtual_count()):
        name = plist.get_virtual_filename(i)
        if name != ".":
            return f"is a virtual dataset mapping data of another file ({name})", 0
        sources.add(plist.get_virtual_dsetname(i).encode())
    fid = h5py.h5i.get_file_id(dsid)
    stored = 0
    for source in sorted(sources):
        try:
            sid = h5d.open(fid, source)
        except (KeyError, ValueError):  # a missing source reads as the fill value: stores nothing
            continue
        if sid.get_create_plist().get_layout() != h5d.VIRTUAL:  # a virtual source stores nothing
            stored += int(sid.get_storage_size())
    return None, stored


def _text(raw: bytes | str) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw


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
            untrusted.check_side_array(group.file.filename, path, obj.shape or (), obj.dtype)
            if obj.shape == () or obj.size <= SMALL_ARRAY_ELEMENTS or obj.dtype.kind in "SOU":
                meta[path] = to_jsonable(obj[()])
            else:
                arrays[path] = np.asarray(obj[()])

    group.visititems(visit)
