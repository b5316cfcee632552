"""What a Minari dataset folder holds, as the reader and both storages see it.

* **Files**: the ``data/`` directory (found from the dataset folder, one of its files, or a
  namespace folder holding one dataset), ``sniff``, a conversion's files, the default cache name.
* **Metadata**: ``data/metadata.json`` (inner JSON strings decoded) and each episode's ``seed``,
  kept exactly as a uint64 or noted as absent.
* **Spaces** in their JSON form (``minari.serialization``): their leaves, the per-step shape of a
  Box/MultiDiscrete/MultiBinary space, and the image spaces Minari >= 0.5.3 stores as JPEG bytes
  (kept as :class:`~rlds_cli.frames.codecs.EncodedFrames`).
* **The storage plug point** (:class:`Store`) between
  :class:`~rlds_cli.formats.minari.reader.MinariReader` and the storages (in :mod:`.reader`),
  each read one episode at a time.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from rlds_cli.errors import FrameError, RldsError, SourceFormatError
from rlds_cli.formats.hdf5_util import (
    hdf5_top_keys,
    is_hdf5_name,
)
from rlds_cli.formats.untrusted import read_json_file
from rlds_cli.frames.codecs import EncodedFrames, FrameFormat, image_format

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
        meta = read_json_file(data / METADATA_FILE)
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
    ``metadata.json``, such a ``metadata.json``, or an HDF5 file with ``episode_*`` groups (or a
    ``main_data.hdf5`` that will not open, so the reader says why)."""
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


#: The largest seed a Minari episode can carry (``DataCollector`` draws 64 random bits).
SEED_MAX = 2**64 - 1
#: metadata.json entries that are JSON strings inside the JSON.
_JSON_STRING_KEYS = ("observation_space", "action_space", "env_spec", "eval_env_spec")
#: metadata.json entries kept under the manifest's ``source.metadata.spaces`` (not ``minari``).
SPACE_KEYS = ("observation_space", "action_space", "env_spec", "eval_env_spec")


def read_metadata(data_dir: Path) -> dict[str, Any]:
    """``data/metadata.json`` as a dict, the JSON strings inside it (spaces, env specs) decoded;
    the two spaces must be JSON objects when present."""
    meta_path = data_dir / METADATA_FILE
    if not meta_path.is_file():
        raise SourceFormatError(
            f"{data_dir} is not a Minari dataset: no {METADATA_FILE}",
            hint="pass the dataset directory (the one holding data/metadata.json)",
        )
    meta = read_json_file(meta_path)
    if not isinstance(meta, dict):
        raise SourceFormatError(f"{meta_path}: expected a JSON object")
    for key in _JSON_STRING_KEYS:
        value = meta.get(key)
        if isinstance(value, str):
            with contextlib.suppress(ValueError):  # not JSON: keep the raw string
                meta[key] = json.loads(value)
    for key in ("observation_space", "action_space"):  # read to plan the arrays: must be objects
        value = meta.get(key)
        if value is not None and not isinstance(value, dict):
            raise SourceFormatError(
                f"{meta_path}: {key!r} is not a JSON object (minari's serialized space): {str(value)[:60]!r}",
                hint="re-create the dataset with minari, or fix the named entry of metadata.json",
            )
    return meta


def as_seed(raw: Any) -> int | None:
    """``raw`` as a seed: an integer in ``[0, 2**64 - 1]`` (one value), else ``None``."""
    if isinstance(raw, bool):
        return None
    value = np.asarray(raw) if not isinstance(raw, int) else raw
    if isinstance(value, np.ndarray):
        if value.size != 1 or value.dtype.kind not in "iu":
            return None
        value = int(value.reshape(-1)[0])
    return value if 0 <= value <= SEED_MAX else None


#: Space types whose arrow values are fixed-size lists (minari's ``_FIXEDLIST_SPACES``).
FIXED_LIST_SPACES = ("Box", "MultiDiscrete", "MultiBinary")


def is_image_space(space: dict[str, Any] | None) -> bool:
    """Minari's test for an image space (JPEG-encoded since 0.5.3), on the JSON form."""
    if not space or space.get("type") != "Box":
        return False
    shape = space.get("shape", [])
    return (
        len(shape) in (2, 3)
        and shape[0] >= 32
        and shape[1] >= 32
        and space.get("dtype") == "uint8"
        and all(v == 0 for v in _flat(space.get("low")))
        and all(v == 255 for v in _flat(space.get("high")))
    )


def _flat(value: Any) -> list[Any]:
    if isinstance(value, list):
        return [x for v in value for x in _flat(v)]
    return [value]


@dataclass(frozen=True)
class Leaf:
    """An array read for every episode: where it is in the episode, and its TED key.

    ``path``: the HDF5 path in the episode group (``observations/_index_0``, ``infos/x``); for the
    arrow storage, ``fields`` are the struct fields to follow inside the column ``path`` starts with.
    """

    path: bytes
    key: str
    space: dict[str, Any] | None
    role: str  # obs | action | rewards | terminations | truncations | info
    fields: tuple[str, ...] = ()


def space_leaves(
    space: dict[str, Any], path: str, key: str, fields: tuple[str, ...], role: str, leaves: list[Leaf]
) -> None:
    """The leaves of a space (JSON form), with the HDF5-style path and arrow fields of each."""
    kind = space.get("type")
    subs = space.get("subspaces")
    if kind == "Dict" and isinstance(subs, dict):
        for name, sub in subs.items():
            space_leaves(sub, f"{path}/{name}", f"{key}/{name}", (*fields, name), role, leaves)
    elif kind == "Tuple" and isinstance(subs, list):
        for j, sub in enumerate(subs):
            space_leaves(sub, f"{path}/_index_{j}", f"{key}/{j}", (*fields, str(j)), role, leaves)
    else:
        leaves.append(Leaf(path.encode(), key, space, role, fields))


def space_shape(space: dict[str, Any]) -> tuple[int, ...]:
    """The per-step shape of a Box, MultiDiscrete or MultiBinary space (JSON form)."""
    if space["type"] == "Box":
        return tuple(int(d) for d in space.get("shape", []))
    if space["type"] == "MultiDiscrete":
        return tuple(np.asarray(space["nvec"]).shape)
    n = space.get("n")
    if isinstance(n, int):
        return (int(n),)
    if not isinstance(n, list | tuple):  # a damaged space description (minari always writes n)
        raise SourceFormatError(f"a {space['type']} space without a valid 'n' (got {n!r})")
    return tuple(int(d) for d in n)


def jpeg_frames(data: list[Any], shape: tuple[int, ...], path: Path, label: str) -> EncodedFrames:
    """An image space's JPEG frames (byte strings, or uint8 arrays of them) kept as they are: each
    frame's header is checked to be a JPEG of the space's ``shape``; pixels are decoded when read."""
    try:
        fmt = FrameFormat("jpeg", tuple(shape))
    except FrameError as exc:
        raise SourceFormatError(f"{path}: {label}: {exc}") from None
    blobs = [raw if isinstance(raw, bytes) else np.asarray(raw, np.uint8).tobytes() for raw in data]
    for j, blob in enumerate(blobs):
        try:
            found = image_format(blob)
        except FrameError as exc:
            raise SourceFormatError(f"{path}: {label} frame {j} is not a readable JPEG ({exc})") from None
        if found.codec != "jpeg":  # minari's jpeg_encoding stores JPEG files only
            raise SourceFormatError(f"{path}: {label} frame {j} is a {found.codec} image, not a JPEG")
        if found.image_shape != fmt.image_shape:
            raise SourceFormatError(
                f"{path}: {label} frame {j} is a JPEG image of {found.image_shape}, the space says "
                f"{tuple(shape)}"
            )
    return EncodedFrames(blobs, fmt)


STEP_KEYS = ("actions", "rewards", "terminations", "truncations")


class Store(Protocol):
    """One of Minari's storages, read episode by episode."""

    where: Path

    def episode_ids(self) -> list[int]:
        """The episode ids, sorted (a format error when there are none)."""

    def count_mismatch(self, declared: int, found: list[int]) -> str:
        """The error text for ``total_episodes`` = ``declared`` when ``found`` differ."""

    def plan(self, first: int, spaces: dict[str, Any]) -> list[Leaf]:
        """The leaves of episode ``first`` (read from every episode), given the JSON ``spaces``."""

    def count_steps(self, ids: list[int]) -> int:
        """The number of steps of the episodes ``ids``, from sizes, without reading the data."""

    def read(self, i: int, leaves: list[Leaf]) -> tuple[str, list[tuple[Leaf, Any]], Any]:
        """Episode ``i``: its label (for errors), each leaf's array (image files: kept as they are,
        :class:`~rlds_cli.frames.codecs.EncodedFrames`), and its raw ``seed`` (or ``None``)."""

    def close(self) -> None:
        """Release what the storage holds open."""
