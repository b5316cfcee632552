"""The files of an RLDS/TFDS dataset folder: shard names, splits, the sniff and the files a
conversion reads.

The names and which folder below a path is the dataset folder come from
:mod:`rlds_cli._util.tfds_layout` (the Hub's download plan uses the same rule): a folder holding
one TFDS dataset folder (``name/version/``) at any depth is read from it; several are refused,
naming them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rlds_cli._util.tfds_layout import FEATURES_FILE, INFO_FILE, SHARD_NAME, one_tfds_folder
from rlds_cli._util.tfds_layout import is_shard_name as _is_shard_name
from rlds_cli.formats.untrusted import UnsafeSourceError

__all__ = [
    "EXPECTED_FILES",
    "FEATURES_FILE",
    "INFO_FILE",
    "Shard",
    "inside_folder",
    "nested_dataset_folder",
    "root_and_shards",
    "shard_from_path",
    "sniff",
    "source_files",
]


@dataclass(frozen=True)
class Shard:
    """One shard file and what its name declares: split, index, shards in the split."""

    path: Path
    split: str
    index: int
    count: int  # shards of the split its name declares (0: not said)


def shard_from_path(path: Path) -> Shard:
    """The shard at ``path`` (split ``""`` and zeros when its name does not follow TFDS's pattern)."""
    match = SHARD_NAME.match(path.name)
    if match is None:
        return Shard(path, "", 0, 0)
    index, count = match.group("index"), match.group("count")
    return Shard(path, match.group("split"), int(index or 0), int(count or 0))


def root_and_shards(path: Path) -> tuple[Path, list[Path], bool]:
    """The dataset folder of ``path``, its shard files (sorted), and whether ``path`` named a
    single shard (then only that one is read)."""
    if path.is_dir():
        root = path if (path / FEATURES_FILE).is_file() else (nested_dataset_folder(path) or path)
    elif path.name in (FEATURES_FILE, INFO_FILE):
        root = path.parent
    else:
        return path.parent, [path], True
    shards = sorted(p for p in root.iterdir() if _is_shard_name(p.name) and p.is_file())
    return root, shards, False


def nested_dataset_folder(folder: Path, names: list[str] | None = None) -> Path | None:
    """The one TFDS dataset folder below ``folder`` (any depth; hidden folders and files left
    out), ``None`` if there is none. ``names``: the files below ``folder``, relative and
    ``/``-separated, when the caller already listed them.

    Raises:
        SourceFormatError: Several of them (the user names one).
    """
    if names is None:
        names = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
    found = one_tfds_folder(names, str(folder), str(folder) + "/")
    return None if found is None else folder / found


#: What a source of this format looks like, said in hints (the reader's ``expected_files``).
EXPECTED_FILES = "an RLDS/TFDS folder (Open X-Embodiment): features.json and *.tfrecord-NNNNN-of-NNNNN shards"


def sniff(path: Path) -> bool:
    """Whether ``path`` is an RLDS/TFDS folder (``features.json`` next to ``*.tfrecord*`` shards),
    one of its shards, or its ``features.json``."""
    try:
        if path.is_dir():
            return (path / FEATURES_FILE).is_file() and any(_is_shard_name(p.name) for p in path.iterdir())
        if path.is_file():
            if path.name == FEATURES_FILE:
                return any(_is_shard_name(p.name) for p in path.parent.iterdir())
            return _is_shard_name(path.name) and (path.parent / FEATURES_FILE).is_file()
    except OSError:
        return False
    return False


def inside_folder(root: Path, file: Path) -> Path:
    """``file`` if it stays inside the dataset folder once symlinks are followed."""
    try:
        real = file.resolve()
    except (OSError, RuntimeError) as exc:
        raise UnsafeSourceError(f"{file} cannot be resolved: {exc}") from None
    if not real.is_relative_to(root.resolve()):
        raise UnsafeSourceError(
            f"{file} escapes the dataset folder {root} (to {real})",
            hint="rlds reads only files inside the dataset folder; the dataset is malicious or broken",
        )
    return file


def source_files(paths: Sequence[Path]) -> list[Path]:
    """The files a conversion reads and hashes: ``features.json``, ``dataset_info.json`` and the
    shards (all of the folder's, or the one shard named)."""
    out: list[Path] = []
    for p in paths:
        root, shards, _ = root_and_shards(p)
        meta = [root / name for name in (FEATURES_FILE, INFO_FILE) if (root / name).is_file()]
        out += [inside_folder(root, f) for f in (*meta, *shards)]
    return list(dict.fromkeys(out))
