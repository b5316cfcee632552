"""Which files of a Hub repo a conversion needs, decided from the repo's layout.

A LeRobot dataset (``meta/info.json`` at the folder's root) needs ``meta/``, ``data/`` and
``videos/`` only. An RLDS/TFDS dataset folder (``features.json`` next to
``<name>-<split>.tfrecord-NNNNN-of-NNNNN`` shards; Open X-Embodiment and its mirrors keep one per
``<name>/<version>/``, found at any depth below the folder named) needs its ``features.json``,
``dataset_info.json`` and the shards of the split read. Any other layout needs its files except
the Hub's own (``.gitattributes``) and the dataset card, and the format is then sniffed from the
downloaded files like a local folder's (Minari, D4RL HDF5, V-D4RL, npz).

The rules read file names only (nothing is downloaded to decide). TFDS dataset folders and shard
splits are recognised by :mod:`rlds_cli._util.tfds_layout`, as for a local folder.
"""

from __future__ import annotations

from typing import Any

from rlds_cli._util.tfds_layout import FEATURES_FILE, INFO_FILE, is_shard_name, one_tfds_folder, shard_split
from rlds_cli.errors import SourceFormatError
from rlds_cli.net.hub.fetch import local_name
from rlds_cli.net.hub.repo import HubFile, HubPath

#: Files a repo carries for the Hub, never for a reader: its git attributes and its dataset card
#: (the card's name is split in two so that it is not read as a docs pointer).
_HUB_FILES = {".gitattributes", "README" + ".md", "readme" + ".md"}
#: The folders of a LeRobot dataset that its reader reads.
_LEROBOT_DIRS = ("meta/", "data/", "videos/")
#: The metadata files of a TFDS dataset folder that the rlds reader reads.
_TFDS_META = (FEATURES_FILE, INFO_FILE)


def layout_format(where: HubPath, files: list[HubFile]) -> str | None:
    """The format the repo layout shows, when the files alone tell (else ``None``: sniffed later).

    Raises:
        SourceFormatError: The folder holds several RLDS/TFDS dataset folders (name one).
    """
    names = {local_name(where, f) for f in files}
    if "meta/info.json" in names:
        return "lerobot"
    return "rlds" if _tfds_folder(where, names) is not None else None


def dataset_folder(where: HubPath, files: list[HubFile], fmt: str | None) -> str:
    """The folder, relative to ``where.path``, that the reader of ``fmt`` is given: an RLDS
    dataset's TFDS folder (``name/version``, ``""`` when it is the folder named), else ``""``.

    Raises:
        SourceFormatError: The folder holds several RLDS/TFDS dataset folders (name one).
    """
    if fmt != "rlds":
        return ""
    return _tfds_folder(where, {local_name(where, f) for f in files}) or ""


def needed_files(
    where: HubPath, files: list[HubFile], fmt: str | None, options: dict[str, Any] | None = None
) -> list[HubFile]:
    """The files of ``files`` that a conversion in format ``fmt`` (with reader ``options``) reads."""
    if fmt == "lerobot":
        return [f for f in files if local_name(where, f).startswith(_LEROBOT_DIRS)]
    if fmt == "rlds" and _tfds_folder(where, {local_name(where, f) for f in files}) is not None:
        return _tfds_files(where, files, (options or {}).get("split"))
    return [f for f in files if local_name(where, f).rsplit("/", 1)[-1] not in _HUB_FILES]


def _split_dir(name: str) -> tuple[str, str]:
    folder, _, base = name.rpartition("/")
    return folder, base


def _tfds_folder(where: HubPath, names: set[str]) -> str | None:
    """The TFDS dataset folder among ``names`` (``""``: the folder named), ``None`` if none;
    several are refused (the user names one)."""
    base = f"hf://datasets/{where.repo}/" + (where.path.strip("/") + "/" if where.path.strip("/") else "")
    return one_tfds_folder(names, str(where), base)


def _tfds_files(where: HubPath, files: list[HubFile], split: object) -> list[HubFile]:
    """The TFDS folder's metadata and the shards of the split the reader reads: ``split`` when
    given, else ``train`` when present (the reader's default), else the only split.

    Raises:
        SourceFormatError: No shards of the split asked for, or several splits, none ``train``
            and none asked for (before anything is fetched).
    """
    root = _tfds_folder(where, {local_name(where, f) for f in files})
    mine = [(f, base) for f in files for d, base in [_split_dir(local_name(where, f))] if d == root]
    splits = sorted({shard_split(base) for _, base in mine if is_shard_name(base)})
    if isinstance(split, str) and split not in splits:
        raise SourceFormatError(
            f"{where}: {root or 'the folder'} has no shards of split {split!r} "
            f"(splits: {', '.join(map(repr, splits))})"
        )
    if not isinstance(split, str) and "train" not in splits and len(splits) > 1:
        raise SourceFormatError(
            f"{where}: {root or 'the folder'} holds the splits {', '.join(map(repr, splits))} "
            "and none is 'train'",
            hint=f"pick one: rlds download {where} --option split=NAME",
        )
    chosen = split if isinstance(split, str) else "train" if "train" in splits else None
    return [
        f for f, base in mine
        if base in _TFDS_META or (is_shard_name(base) and chosen in (None, shard_split(base)))
    ]  # fmt: skip
