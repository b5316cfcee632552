"""Where a Minari dataset's files are: its ``data/`` directory (found from the dataset folder, one
of its files or a namespace folder holding one dataset), ``sniff``, the files a conversion reads,
and the cache name a dataset gets by default."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Sequence
from pathlib import Path

from rlds_cli.errors import RldsError, SourceFormatError
from rlds_cli.formats.hdf5_util import (
    hdf5_top_keys,
    is_hdf5_name,
)

METADATA_FILE = "metadata.json"
MAIN_FILE = "main_data.hdf5"
#: Written by minari in every namespace directory (``<root>/<namespace>/namespace_metadata.json``).
NAMESPACE_FILE = "namespace_metadata.json"
#: Minari's storages that are read with pyarrow: ``data/<episode id>/part-0.<format>``.
ARROW_FORMATS = ("arrow", "parquet")
EPISODE_DIR_RE = re.compile(r"^\d+$")


def find_datasets(path: Path) -> list[Path]:
    """The ``data/`` directories of the Minari datasets anywhere below the directory ``path``
    (a namespace directory, or an unpacked archive of one), sorted."""
    return sorted(p.parent for p in path.rglob(METADATA_FILE) if p.parent.name == "data" and p.is_file())


def data_dir_of(path: Path) -> Path:
    """The ``data/`` directory of a Minari dataset given its directory, ``data/``, one of its
    files, or a directory (a namespace) holding exactly one dataset somewhere below it.

    Raises:
        SourceFormatError: ``path`` holds several Minari datasets.
    """
    if path.is_file():
        parent = path.parent
        # a file of an arrow episode: data/<id>/part-0.arrow
        if EPISODE_DIR_RE.match(parent.name) and (parent.parent / METADATA_FILE).is_file():
            return parent.parent
        return parent
    if (path / "data" / METADATA_FILE).is_file():
        return path / "data"
    if (path / METADATA_FILE).is_file() or not path.is_dir():
        return path
    found = find_datasets(path)
    if len(found) > 1:
        names = ", ".join(str(d.parent.relative_to(path)) for d in found[:4])
        raise SourceFormatError(
            f"{path} holds {len(found)} Minari datasets ({names}{', ...' if len(found) > 4 else ''})",
            hint=f"convert one at a time: pass its directory, e.g. {found[0].parent}",
        )
    return found[0] if found else path


def default_name(path: Path) -> str | None:
    """The cache name a Minari dataset at ``path`` gets by default: its ``dataset_id`` with its
    namespace (``pendulum/random-v0``), or ``None`` when ``path`` is no Minari dataset."""
    from rlds_cli.cache.root import validate_name

    try:
        if (
            path.is_file()
            and path.name not in (METADATA_FILE, MAIN_FILE)
            and path.suffix
            not in (
                ".arrow",
                ".parquet",
            )
        ):
            return None
        data = data_dir_of(path)
        meta = json.loads((data / METADATA_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, RldsError):
        return None
    if not isinstance(meta, dict) or ("data_format" not in meta and "total_episodes" not in meta):
        return None
    candidates = []
    if isinstance(meta.get("dataset_id"), str):
        candidates.append(meta["dataset_id"])
    # no usable id: the dataset's directory, under its namespace directories
    parts, where = [data.parent.name], data.parent.parent
    while (where / NAMESPACE_FILE).is_file() and where.name:
        parts.insert(0, where.name)
        where = where.parent
    candidates.append("/".join(parts))
    for name in candidates:
        with contextlib.suppress(RldsError):
            return validate_name(name)
    return None


#: What a source of this format looks like, said in hints (the reader's ``expected_files``).
EXPECTED_FILES = (
    "a Minari dataset folder: data/metadata.json with data/main_data.hdf5 (or the "
    "numbered episode folders of an arrow/parquet dataset)"
)


def sniff(path: Path) -> bool:
    """Whether ``path`` is a Minari dataset: a folder holding ``data/metadata.json`` or
    ``metadata.json``, such a ``metadata.json``, or an HDF5 file with ``episode_*`` groups (a
    ``main_data.hdf5`` that will not open too, so that this reader says why)."""
    if path.is_dir():
        return (path / "data" / "metadata.json").is_file() or (path / "metadata.json").is_file()
    if path.name.lower() == "metadata.json":
        return True
    if not is_hdf5_name(path):
        return False
    keys = hdf5_top_keys(path)
    return path.name == "main_data.hdf5" if keys is None else any(k.startswith("episode_") for k in keys)


def source_files(paths: Sequence[Path]) -> list[Path]:
    """The files a Minari conversion reads (hashed into the manifest)."""
    data = data_dir_of(paths[0])
    files = [p for p in (data / METADATA_FILE, data / MAIN_FILE) if p.exists()]
    if (data / MAIN_FILE).exists():
        return files
    # arrow/parquet: each episode directory's files, in episode order
    episodes = sorted(
        (int(d.name), d) for d in (data.iterdir() if data.is_dir() else []) if EPISODE_DIR_RE.match(d.name)
    )
    for _, d in episodes:
        files.extend(sorted(f for f in d.iterdir() if f.is_file() and not f.name.startswith((".", "_"))))
    return files
