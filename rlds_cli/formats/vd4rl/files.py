"""V-D4RL's files: the two layouts, how each is recognised (``sniff``), in which order a source's
files are read (``source_files``), and each opened for reading.

Two layouts hold the same data (``conglu/vd4rl`` on the Hugging Face hub, read by TorchRL's
``VD4RLExperienceReplay``):

* **Dreamer episodes** (64px): one ``np.savez_compressed`` file per episode, named
  ``<YYYYmmddTHHMMSS>-<uuid hex>-<rows>.npz``, with ``image (R, 64, 64, 3) uint8`` (HWC),
  ``action (R, A)`` (row 0 zeros), ``reward (R,)`` (row 0 is 0), ``discount (R,)`` and bool flags
  ``is_first``, ``is_last``, ``is_terminal`` (absent in older files: ``discount == 0``). R is
  501: the reset observation and 500 steps.
* **drqbc shards** (84px): ``observation (N, 3, 84, 84) uint8`` (CHW), ``action``, ``reward``,
  ``discount`` and ``step_type`` (0 first, 1 mid, 2 last; ``float64`` in the V-D4RL scripts'
  files) concatenated over many episodes; ``split_hdf5_shards.py`` cuts a file into shards by
  rows, so an episode may span shards.

Dreamer episodes are read in name order (timestamp), drqbc shards in natural name order
(``2.hdf5`` before ``10.hdf5``).

**Opened for reading**: a Dreamer episode ``.npz`` (:class:`NpzEpisode`) and a
drqbc ``.hdf5`` shard (:class:`Shard`), headers checked before a row is read, and the
:class:`Schema` every file of a source must agree on.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.errors import SourceFormatError
from rlds_cli.formats.base import ConversionReport, is_text, text_note
from rlds_cli.formats.folders import folder_files, name_mismatch
from rlds_cli.formats.untrusted import require_numeric, require_rows

#: Frame array names, in order of preference (Dreamer writes ``image``; drqbc ``observation``).
PIXEL_KEYS = ("image", "observation")
#: Dreamer arrays the reader consumes (never stored as keys of their own).
NPZ_FLAGS = ("is_first", "is_last", "is_terminal", "discount")
NPZ_REQUIRED = ("action", "reward", "is_first", "is_last")
HDF5_REQUIRED = ("observation", "action", "reward", "discount", "step_type")
HDF5_CONSUMED = ("discount", "step_type")
HDF5_SUFFIXES = (".hdf5", ".h5")


# --------------------------------------------------------------------------- detection


def _zip_keys(path: Path) -> set[str] | None:
    try:
        with zipfile.ZipFile(path) as z:
            return {n[:-4] for n in z.namelist() if n.endswith(".npy")}
    except (OSError, zipfile.BadZipFile):
        return None


def _is_dreamer_npz(path: Path) -> bool:
    keys = _zip_keys(path)
    return keys is not None and set(NPZ_REQUIRED) <= keys and bool(keys & set(PIXEL_KEYS))


def _is_drqbc_hdf5(path: Path) -> bool:
    import h5py

    try:
        with h5py.File(path, "r") as f:
            return "step_type" in f and "observation" in f
    except (OSError, ValueError):
        return False


def _candidates(folder: Path) -> list[Path]:
    """The ``.npz`` and ``.hdf5``/``.h5`` files under ``folder``, minus hidden and in-progress names
    (:mod:`rlds_cli.formats.folders`)."""
    return folder_files(folder, lambda p: p.name.lower().endswith((".npz", *HDF5_SUFFIXES)))


def _sniff_file(path: Path) -> bool:
    name = path.name.lower()
    if name.endswith(".npz"):
        return _is_dreamer_npz(path)
    if name.endswith(HDF5_SUFFIXES):
        return _is_drqbc_hdf5(path)
    return False


#: What a source of this format looks like, said in hints (the reader's ``expected_files``).
EXPECTED_FILES = (
    "V-D4RL data: Dreamer episode .npz files (image, action, reward, is_first, is_last) or a "
    "drqbc .hdf5 with observation, action, reward, discount and step_type"
)


def sniff(path: Path) -> bool:
    """Whether ``path`` is V-D4RL data: a Dreamer episode ``.npz`` (``image`` or
    ``observation``, ``action``, ``reward``, ``is_first``, ``is_last``), a drqbc ``.hdf5``
    (``step_type`` and ``observation``), or a folder whose first such file (by name) is one."""
    try:
        if path.is_dir():
            files = _candidates(path)
            return bool(files) and _sniff_file(files[0])
        return path.is_file() and _sniff_file(path)
    except Exception:  # a sniffer never raises on another format's path
        return False


def _natural(path: Path) -> tuple[Any, ...]:
    """Sort key giving ``2.hdf5`` before ``10.hdf5`` (the shard writer numbers them)."""
    parts = re.split(r"(\d+)", path.as_posix())
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts)


def source_files(paths: Sequence[Path]) -> list[Path]:
    """The files a conversion reads, in reading order: Dreamer ``.npz`` episodes by name
    (timestamp order), drqbc shards in natural name order (``2.hdf5`` before ``10.hdf5``)."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            files = _candidates(p)
            out += sorted((f for f in files if f.suffix.lower() == ".npz"), key=lambda f: f.as_posix())
            out += sorted((f for f in files if f.suffix.lower() != ".npz"), key=_natural)
        else:
            out.append(p)
    return out


def _layout(where: object, key: str, shape: tuple[int, ...], prefer: str) -> str:
    """``"HWC"`` or ``"CHW"`` for a frame of ``shape`` (the axis of 1, 3 or 4 is the channel
    axis; ``prefer`` when both could be); anything else is refused."""
    if len(shape) != 3:
        raise SourceFormatError(
            f"{where}: {key!r} has frames of shape {list(shape)}, not an image (H, W, C) or (C, H, W)",
            hint="V-D4RL frames are (64, 64, 3) HWC in Dreamer .npz files, (3, 84, 84) CHW in drqbc .hdf5",
        )
    hwc, chw = shape[-1] in (1, 3, 4), shape[0] in (1, 3, 4)
    if hwc and chw:
        return prefer
    if hwc or chw:
        return "HWC" if hwc else "CHW"
    raise SourceFormatError(
        f"{where}: {key!r} has frames of shape {list(shape)}, with no channel axis of 1, 3 or 4",
        hint="V-D4RL frames are (64, 64, 3) HWC in Dreamer .npz files, (3, 84, 84) CHW in drqbc .hdf5",
    )


def _extra_arrays(
    path: Path, arrays: Mapping[str, Any], consumed: Sequence[str], report: ConversionReport
) -> dict[str, tuple[tuple[int, ...], str]]:
    """Row shape and dtype of each array of a file stored besides those the layout consumes; text
    arrays are noted as dropped, other non-numeric ones refused."""
    extras: dict[str, tuple[tuple[int, ...], str]] = {}
    for key, array in arrays.items():
        if key in consumed:
            continue
        if is_text(array.dtype):
            note = text_note(key, array.dtype)
            if note not in report.notes:
                report.notes.append(note)
            continue
        require_numeric(path, key, array.dtype)
        extras[key] = (tuple(array.shape[1:]), array.dtype.str)
    return extras


def _check_pixels(where: object, key: str, shape: tuple[int, ...], dtype: np.dtype, prefer: str) -> str:
    if np.dtype(dtype) != np.uint8:
        raise SourceFormatError(
            f"{where}: {key!r} holds {np.dtype(dtype)} frames; V-D4RL frames are uint8",
            hint="rlds keeps frames as uint8 from source to cache; convert the file's frames to uint8",
        )
    return _layout(where, key, shape[1:], prefer)


def _one_per_row(where: object, key: str, shape: tuple[int, ...]) -> None:
    if shape[1:] not in ((), (1,)):
        raise SourceFormatError(f"{where}: {key!r} has shape {list(shape)}; it needs one value per row")


@dataclass
class Schema:
    """What every file of a source must agree on: the stored arrays' per-row shapes and dtypes."""

    pixel: str
    layout: str
    frame: tuple[int, ...]
    extras: dict[str, tuple[tuple[int, ...], str]]
    action: tuple[tuple[int, ...], str]
    reward: tuple[tuple[int, ...], str]
    first: Path

    def _specs(self) -> dict[str, object]:
        return {self.pixel: self.frame, **self.extras, "action": self.action, "reward": self.reward}

    def same(self, other: Schema) -> str | None:
        """What differs from ``other`` (``None``: nothing)."""
        mine, theirs = self._specs(), other._specs()
        diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        return ", ".join(diff) if diff else None

    def row_bytes(self) -> int:
        """Bytes of one source row of the stored arrays."""
        specs = [(self.frame, "|u1"), *self.extras.values(), self.action, self.reward]
        return sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize for shape, dt in specs)


# --------------------------------------------------------------------------- Dreamer .npz


class NpzEpisode:
    """One Dreamer episode file, its arrays opened as row streams (headers checked)."""

    def __init__(self, path: Path) -> None:
        from rlds_cli.formats.npz_util import NpyStream, npz_keys, open_npz

        self.path = path
        self.zf = open_npz(path)
        self.streams: dict[str, Any] = {}
        try:
            keys = npz_keys(self.zf)
            missing = [k for k in NPZ_REQUIRED if k not in keys]
            pixel = next((k for k in PIXEL_KEYS if k in keys), None)
            if missing or pixel is None:
                what = missing[0] if missing else "image"
                raise SourceFormatError(
                    f"{path} has no {what!r} array; a Dreamer episode file needs image (or observation), "
                    f"{', '.join(NPZ_REQUIRED)} (found: {', '.join(sorted(keys)) or 'nothing'})"
                )
            if "is_terminal" not in keys and "discount" not in keys:
                raise SourceFormatError(
                    f"{path} has neither 'is_terminal' nor 'discount'; one of them says whether the "
                    f"episode terminated (found: {', '.join(sorted(keys))})"
                )
            self.pixel = pixel
            for k in sorted(keys):
                self.streams[k] = NpyStream(self.zf, k, path)
            self.rows = self._check()
        except BaseException:
            self.close()
            raise

    def _check(self) -> int:
        path, streams = self.path, self.streams
        for key, s in streams.items():
            require_rows(path, key, s.shape)
        rows = streams[self.pixel].shape[0]
        for key, s in streams.items():
            if s.shape[0] != rows:
                raise SourceFormatError(
                    f"{path}: {key!r} has {s.shape[0]} rows but {self.pixel!r} has {rows} "
                    "(arrays of one episode must have one row each per time step)"
                )
        for key in (*NPZ_REQUIRED, *(k for k in NPZ_FLAGS if k in streams)):
            require_numeric(path, key, streams[key].dtype)
        for key in ("reward", *(k for k in NPZ_FLAGS if k in streams)):
            _one_per_row(path, key, streams[key].shape)
        if rows == 0:
            raise SourceFormatError(f"{path}: the episode holds no rows")
        self.name_note = name_mismatch(path, rows)  # a label only: the arrays decide
        return rows

    def schema(self, report: ConversionReport) -> Schema:
        """The stored arrays' shapes and dtypes; text arrays are noted as dropped."""
        s = self.streams
        layout = _check_pixels(self.path, self.pixel, s[self.pixel].shape, s[self.pixel].dtype, "HWC")
        extras = _extra_arrays(self.path, s, (self.pixel, "action", "reward", *NPZ_FLAGS), report)
        return Schema(
            pixel=self.pixel,
            layout=layout,
            frame=tuple(s[self.pixel].shape[1:]),
            extras=extras,
            action=(tuple(s["action"].shape[1:]), s["action"].dtype.str),
            reward=(tuple(s["reward"].shape[1:]), s["reward"].dtype.str),
            first=self.path,
        )

    def read(self, keys: Sequence[str], rows: int) -> dict[str, np.ndarray]:
        """The next ``rows`` rows of the arrays ``keys``."""
        return {k: self.streams[k].read(rows) for k in keys}

    def close(self) -> None:
        for s in self.streams.values():
            s.close()
        self.zf.close()


# --------------------------------------------------------------------------- drqbc .hdf5


class Shard:
    """One drqbc shard, its datasets checked (no links out, no bombs, equal lengths)."""

    def __init__(self, path: Path) -> None:
        from rlds_cli.formats.hdf5_util import open_hdf5

        self.path = path
        self.f = open_hdf5(path)
        try:
            self.datasets = self._datasets()
            self.rows = self._check()
        except BaseException:
            self.f.close()
            raise

    def _datasets(self) -> dict[str, Any]:
        import h5py

        found: dict[str, Any] = {}

        def visit(name: str, obj: Any) -> None:
            if isinstance(obj, h5py.Dataset):
                found[name] = obj

        self.f.visititems(visit)
        missing = [k for k in HDF5_REQUIRED if k not in found]
        if missing:
            raise SourceFormatError(
                f"{self.path} has no {missing[0]!r} dataset; a drqbc shard needs {', '.join(HDF5_REQUIRED)} "
                f"(found: {', '.join(sorted(found)) or 'nothing'})"
            )
        return found

    def _check(self) -> int:
        path, ds = self.path, self.datasets
        for key, d in ds.items():
            require_rows(path, key, d.shape)
        rows = int(ds["observation"].shape[0])
        for key, d in ds.items():
            if d.shape[0] != rows:
                raise SourceFormatError(
                    f"{path}: {key!r} has {d.shape[0]} rows but 'observation' has {rows} (ragged datasets)"
                )
        for key in HDF5_REQUIRED:
            require_numeric(path, key, ds[key].dtype)
        for key in ("reward", *HDF5_CONSUMED):
            _one_per_row(path, key, ds[key].shape)
        if rows == 0:
            raise SourceFormatError(f"{path}: the shard holds no rows")
        return rows

    def schema(self, report: ConversionReport) -> Schema:
        ds = self.datasets
        obs = ds["observation"]
        layout = _check_pixels(self.path, "observation", obs.shape, obs.dtype, "CHW")
        extras = _extra_arrays(self.path, ds, ("observation", "action", "reward", *HDF5_CONSUMED), report)
        return Schema(
            pixel="observation",
            layout=layout,
            frame=tuple(obs.shape[1:]),
            extras=extras,
            action=(tuple(ds["action"].shape[1:]), ds["action"].dtype.str),
            reward=(tuple(ds["reward"].shape[1:]), ds["reward"].dtype.str),
            first=self.path,
        )

    def step_type(self, start: int, stop: int) -> np.ndarray:
        st = self.read("step_type", start, stop).reshape(-1)
        bad = np.flatnonzero(~np.isin(st, (0, 1, 2)))
        if len(bad):
            raise SourceFormatError(
                f"{self.path}: step_type is {st[bad[0]].item()!r} at row {start + int(bad[0])}; drqbc step "
                "types are 0 (first), 1 (mid) and 2 (last)"
            )
        return st.astype(np.int8)

    def read(self, key: str, start: int, stop: int) -> np.ndarray:
        from rlds_cli.formats.hdf5_util import read_error

        try:
            return np.asarray(self.datasets[key][start:stop])
        except (OSError, RuntimeError, ValueError) as exc:
            raise read_error(self.path, key, exc) from exc

    def close(self) -> None:
        self.f.close()
