"""The file names of an RLDS/TFDS dataset folder, and which folders in a list of file names are such.

A TFDS dataset folder holds ``features.json`` next to ``<name>-<split>.tfrecord[-NNNNN-of-NNNNN]``
shards (Open X-Embodiment keeps one per ``<name>/<version>/``). The rules read names only; used by
``formats/rlds_tfrecord/reader.py`` and the Hub plan (``net/hub.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from rlds_cli.errors import SourceFormatError

FEATURES_FILE = "features.json"
INFO_FILE = "dataset_info.json"
#: A shard's name: the dataset's name, its split, and (when sharded) its index and count.
SHARD_NAME = re.compile(r"^(?P<name>.+)-(?P<split>[^-.]+)\.tfrecord(?:-(?P<index>\d+)-of-(?P<count>\d+))?$")
#: How ``dataset_info.json`` names a split's shards (TFDS's ``filepathTemplate``), which
#: :func:`shard_name` follows.
FILEPATH_TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"


def shard_name(name: str, split: str, index: int, count: int) -> str:
    """The file name of shard ``index`` of ``count`` of a split, as TFDS writes it
    (``<name>-<split>.tfrecord-00000-of-00004``); :data:`SHARD_NAME` reads it back."""
    return f"{name}-{split}.tfrecord-{index:05d}-of-{count:05d}"


def is_shard_name(name: str) -> bool:
    """Whether a base name is a TFRecord shard's (holds ``.tfrecord``, not hidden, not an HDF5 or
    ``.npz`` name)."""
    return ".tfrecord" in name and not name.startswith(".") and not name.lower().endswith(_NOT_SHARDS)


_NOT_SHARDS = (".h5", ".hdf5", ".npz")


def shard_split(name: str) -> str:
    """The split a shard's base name declares (``""``: none said)."""
    match = SHARD_NAME.match(name)
    return match.group("split") if match else ""


def tfds_folders(names: Iterable[str]) -> list[str]:
    """The TFDS dataset folders among ``names`` (``/``-separated relative file paths), sorted: each
    a folder (``""`` for the top) that holds ``features.json`` and at least one shard. Paths
    through a hidden folder (a tool's copy, a cache) are left out."""
    visible = (name for name in names if not any(part.startswith(".") for part in name.split("/")))
    parts = [name.rpartition("/")[::2] for name in visible]
    with_shards = {folder for folder, base in parts if is_shard_name(base)}
    return sorted(folder for folder, base in parts if base == FEATURES_FILE and folder in with_shards)


def one_tfds_folder(names: Iterable[str], source: str, prefix: str) -> str | None:
    """The one TFDS dataset folder among ``names`` (``None`` if there is none).

    Args:
        names: Relative file paths below ``source``.
        source: What the user named, as the refusal says it.
        prefix: What the user would name instead, before a folder's relative path.

    Raises:
        SourceFormatError: Several folders (rlds converts one at a time).
    """
    found = tfds_folders(names)
    if len(found) > 1:
        shown = ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
        raise SourceFormatError(
            f"{source} holds {len(found)} RLDS/TFDS dataset folders ({shown}); rlds converts one at a time",
            hint=f"name one, e.g. {prefix}{found[0]}",
        )
    return found[0] if found else None
