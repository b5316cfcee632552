"""Gen-DGRL's files: the layout, ``sniff``, ``source_files``, and the level seed in the collector's
file names.

The released archives (``<game>.tar.xz`` at ``dl.fbaipublicfiles.com/DGRL/Procgen/...``) hold one
file per trajectory, which TorchRL reads with ``np.load(member, allow_pickle=True).tolist()``: a
``.npy`` of a **pickled dict** (``np.save(f, dict)``, a 0-d object array). The gen_dgrl collector
writes ``np.savez_compressed`` episodes named
``{timestamp}_{idx}_{len}_{level_seed}_{return:.2f}.npz``. Both are read, in an archive or as loose
files. Keys: ``observations`` ``(T + 1, 3, 64, 64)``, ``actions`` ``(T, 1)``, ``rewards``
``(T, 1)``, ``dones`` ``(T,)``.
"""

from __future__ import annotations

import io
import re
import tarfile
import zipfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import IO

import numpy as np

from rlds_cli.formats.archives import TAR_SUFFIXES
from rlds_cli.formats.folders import folder_files
from rlds_cli.formats.npz_util import npz_keys

REQUIRED_KEYS = ("observations", "actions", "rewards", "dones")
#: Trajectory files, loose or inside an archive.
TRAJECTORY_SUFFIXES = (".npy", ".npz")
#: How far into a pickled ``.npy`` sniffing looks for the ``observations`` key.
_SNIFF_BYTES = 256 << 10
#: Largest first ``.npz`` member sniffing reads to see its keys.
_SNIFF_NPZ_BYTES = 64 << 20
#: The collector's file names: ``{timestamp}_{idx}_{len}_{level_seed}_{return:.2f}``.
_COLLECTOR_NAME = re.compile(r"^[^_]+_(?P<index>\d+)_(?P<length>\d+)_(?P<seed>-?\d+)_[^_]+$")
TRAJECTORY_KEYS = "observations, actions, rewards and dones"


# ----------------------------------------------------------------------------- detection


def is_tar(path: Path) -> bool:
    return path.name.lower().endswith(TAR_SUFFIXES)


def _sniff_npy(fh: IO[bytes]) -> bool:
    """A 0-d object array (a pickled object) whose pickle names ``observations`` early on."""
    version = np.lib.format.read_magic(fh)
    read_header = (
        np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    )
    shape, _, dtype = read_header(fh)
    return bool(dtype.hasobject) and shape == () and b"observations" in fh.read(_SNIFF_BYTES)


def _sniff_npz(zf: zipfile.ZipFile) -> bool:
    """The four trajectory keys, and no ``terminals`` (that is OGBench's or D4RL's layout)."""
    keys = set(npz_keys(zf))
    return set(REQUIRED_KEYS) <= keys and "terminals" not in keys


def _sniff_tar(path: Path) -> bool:
    """Peek at the first file member only (directories before it are skipped)."""
    from rlds_cli.formats.archives import decompressing_reader

    with (
        open(path, "rb") as raw,
        decompressing_reader(raw) as stream,
        tarfile.open(fileobj=stream, mode="r|") as tf,
    ):
        for seen, member in enumerate(tf):
            if member.isdir() and seen < 64:
                continue
            name = member.name.lower()
            fh = tf.extractfile(member) if member.isfile() else None
            if fh is None:
                return False
            if name.endswith(".npy"):
                return _sniff_npy(fh)
            if name.endswith(".npz") and member.size <= _SNIFF_NPZ_BYTES:
                with zipfile.ZipFile(io.BytesIO(fh.read())) as zf:
                    return _sniff_npz(zf)
            return False
    return False


def _sniff_file(path: Path) -> bool:
    name = path.name.lower()
    if is_tar(path):
        return _sniff_tar(path)
    if name.endswith(".npy"):
        with open(path, "rb") as fh:
            return _sniff_npy(fh)
    if name.endswith(".npz"):
        with zipfile.ZipFile(path) as zf:
            return _sniff_npz(zf)
    return False


#: What a source of this format looks like, said in hints (the reader's ``expected_files``).
EXPECTED_FILES = (
    "a Gen-DGRL (Procgen) .tar.xz of per-trajectory .npy (pickled dict) or .npz files with "
    "observations, actions, rewards and dones"
)


def sniff(path: Path) -> bool:
    """Whether ``path`` is a Gen-DGRL source: a tar archive whose first file is a trajectory ``.npy``
    (pickled dict) or ``.npz``, such a loose file, or a folder of them (judged by its first
    trajectory file). Reads one member or file header; never raises."""
    try:
        if path.is_dir():
            files = source_files([path])
            return bool(files) and _sniff_file(files[0])
        return path.is_file() and _sniff_file(path)
    except Exception:  # any other format's file: not ours
        return False


def source_files(paths: Sequence[Path]) -> list[Path]:
    """The files a Gen-DGRL conversion reads: each archive or file given, and a folder's
    ``.npy``/``.npz`` files in sorted path order."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out += folder_files(p, lambda q: q.suffix.lower() in TRAJECTORY_SUFFIXES)
        else:
            out.append(p)
    return out


def level_seed(name: str) -> int:
    """The level seed of a collector file name (``..._{level_seed}_{return}``), else -1."""
    match = _COLLECTOR_NAME.match(PurePosixPath(name).stem)
    return int(match["seed"]) if match else -1
