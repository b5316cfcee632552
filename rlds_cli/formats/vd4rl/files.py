"""V-D4RL's files: the two layouts, how each is recognised (``sniff``) and in which order a source's
files are read (``source_files``).

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
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlds_cli.formats.folders import folder_files

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
