"""The manifest: the JSON document that describes, and commits, a cached dataset.

``manifest.json`` is written last, inside the build directory, before the directory is
renamed into place; a dataset directory without it is not a dataset.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rlds_cli._util.io import atomic_write
from rlds_cli._version import __version__
from rlds_cli.cache.integrity import check_manifest_data, damage_hint, manifest_name
from rlds_cli.cache.layout import COMPOSED_LAYOUT, DATASETS_DIR, MANIFEST_FILE
from rlds_cli.cache.ted import key_problem
from rlds_cli.errors import CorruptDatasetError

if TYPE_CHECKING:
    from rlds_cli.frames.codecs import FrameFormat

FORMAT_NAME = "rlds-ted"
#: The newest format this rlds reads and writes; version 2 is needed only for frame columns (a
#: field's ``codec``).
FORMAT_VERSION = 2
#: The version of a dataset whose fields are all plain arrays.
PLAIN_FORMAT_VERSION = 1

#: ``flat``: stored once per step plus one final row per episode (N + E rows); read back as
#: ``key`` and ``next/key``. ``step``: stored once per step (N rows), read back as is.
Storage = Literal["flat", "step"]


@dataclass(frozen=True)
class FieldSpec:
    """One stored array: TED key, per-step shape, dtype, storage kind, and for compressed frames
    their ``codec`` (``"raw"``: a plain array) and channel order
    (:mod:`rlds_cli.cache.backends.frames`)."""

    key: str
    shape: tuple[int, ...]
    dtype: str
    storage: Storage
    codec: str = "raw"
    channels_first: bool = False

    @property
    def frame_format(self) -> FrameFormat | None:
        """How the frames are stored (``None``: a plain array)."""
        if self.codec == "raw":
            return None
        from rlds_cli.frames.codecs import FrameFormat  # here: reading a manifest needs no numpy

        return FrameFormat(self.codec, self.shape, self.channels_first)

    @property
    def row_bytes(self) -> int:
        """Bytes of one stored row."""
        import numpy as np  # here: reading a manifest needs no numpy

        return np.dtype(self.dtype).itemsize * math.prod(self.shape)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"shape": list(self.shape), "dtype": self.dtype, "storage": self.storage}
        if self.codec != "raw":  # only frame columns: a plain field's spec (and digest) is unchanged
            out["codec"] = self.codec
            if self.channels_first:
                out["channels_first"] = True
        return out

    @classmethod
    def from_dict(cls, key: str, data: dict[str, Any]) -> FieldSpec:
        shape = tuple(int(d) for d in data["shape"])
        codec, channels_first = str(data.get("codec", "raw")), bool(data.get("channels_first", False))
        return cls(key, shape, str(data["dtype"]), data["storage"], codec, channels_first)


@dataclass
class Manifest:
    """Everything rlds knows about one cached dataset.

    Attributes:
        name: The dataset name (the cache entry).
        backend: ``"memmap"`` or ``"zarr"``.
        num_steps: Number of transitions (N).
        num_episodes: Number of episodes (E).
        fields: Stored arrays by TED key.
        source: Where the data came from: format, path or id, sha256, size, metadata.
        conversion: What the converter decided (dropped rows, inferred boundaries, notes).
        lineage: Parents of a derived dataset (empty for a converted one).
        stats: Dataset-wide statistics per key, written by ``rlds preprocess --stats``
            (read them with :func:`rlds_cli.cache.stats.load`); empty when not computed.
        content_digest: Digests (XXH3-128; sha256 in older datasets) of every stored array's
            logical values, the episode index and ``source_metadata.npz``, recorded at publish
            (:mod:`rlds_cli.cache.digest`); may be empty.
        card: The dataset card: licence, citation, robot type, fps, description (see
            :mod:`rlds_cli.cache.card`); empty when nothing is known.
        env: The recording environment: ``{"spec": <gymnasium EnvSpec as JSON>, "eval_spec":
            ..., "origin": ...}`` (:mod:`rlds_cli.cache.env_spec`); empty when unknown.
        created_by: ``rlds-cli <version>`` that wrote the dataset.
        created_at: UTC timestamp of the write.
    """

    name: str
    backend: str
    num_steps: int
    num_episodes: int
    fields: dict[str, FieldSpec]
    source: dict[str, Any] = field(default_factory=dict)
    conversion: dict[str, Any] = field(default_factory=dict)
    lineage: list[dict[str, Any]] = field(default_factory=list)
    created_by: str = f"rlds-cli {__version__}"
    created_at: str = field(default_factory=lambda: _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))
    format_version: int = PLAIN_FORMAT_VERSION
    layout: str = "flat-ted"
    stats: dict[str, Any] = field(default_factory=dict)
    content_digest: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)
    card: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if any(spec.codec != "raw" for spec in self.fields.values()):
            self.format_version = max(self.format_version, FORMAT_VERSION)  # older rlds must refuse it

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": FORMAT_NAME,
            "format_version": self.format_version,
            "layout": self.layout,
            "name": self.name,
            "backend": self.backend,
            "num_steps": self.num_steps,
            "num_episodes": self.num_episodes,
            "fields": {k: spec.to_dict() for k, spec in self.fields.items()},
            "source": self.source,
            "conversion": self.conversion,
            "lineage": self.lineage,
            "created_by": self.created_by,
            "created_at": self.created_at,
        }
        if self.stats:  # only derived datasets with --stats carry it
            out["stats"] = self.stats
        # optional keys only when set: a manifest read and written back keeps the digest() that
        # views and derived datasets pin
        if self.content_digest:
            out["content_digest"] = self.content_digest
        if self.env:
            out["env"] = self.env
        if self.card:
            out["card"] = self.card
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        return cls(
            name=data["name"],
            backend=data["backend"],
            num_steps=int(data["num_steps"]),
            num_episodes=int(data["num_episodes"]),
            fields={k: FieldSpec.from_dict(k, v) for k, v in data["fields"].items()},
            source=data.get("source", {}),
            conversion=data.get("conversion", {}),
            lineage=data.get("lineage", []),
            created_by=data.get("created_by", ""),
            created_at=data.get("created_at", ""),
            format_version=int(data["format_version"]),
            layout=data.get("layout", "flat-ted"),
            stats=data.get("stats", {}),
            content_digest=_digest_dict(data.get("content_digest", {})),
            env=_env_dict(data.get("env", {})),
            card=_card_dict(data.get("card", {})),
        )

    def parent_names(self) -> list[str]:
        """The datasets this one is made from: those its lineage names and, for a composed dataset,
        the parents of the parts it reads (a selection of a merge or trim names the merge in its
        lineage but reads the merge's parents, which outlive a replaced merge)."""
        names = [entry.get("name") for entry in self.lineage]
        if self.layout == COMPOSED_LAYOUT and isinstance(self.source.get("parts"), list):
            names += [part.get("parent") for part in self.source["parts"] if isinstance(part, dict)]
        return list(dict.fromkeys(n for n in names if isinstance(n, str)))

    def digest(self) -> str:
        """A sha256 of the canonical JSON, used by derived datasets to pin their parent (and, written
        into the file, by the manifest to check itself: :data:`SELF_DIGEST`)."""
        return canonical_sha256(self.to_dict())


#: The key of a manifest's own digest: the sha256 of its canonical JSON without this key (what
#: :meth:`Manifest.digest` gives), written by :func:`manifest_text` and checked by
#: :func:`parse_manifest`, so a changed byte anywhere in the file (a value, a key's name) is damage,
#: never a silently different dataset. A manifest without it is an older rlds's; those are held to
#: knowing every key (:data:`MANIFEST_KEYS`), so a damaged name of this key is damage too.
SELF_DIGEST = "manifest_sha256"
#: Every top-level key an rlds manifest holds (its own digest aside).
MANIFEST_KEYS = frozenset(
    {
        "format", "format_version", "layout", "name", "backend", "num_steps", "num_episodes", "fields",
        "source", "conversion", "lineage", "created_by", "created_at", "stats", "content_digest", "env",
        "card",
    }
)  # fmt: skip


def canonical_sha256(data: dict[str, Any]) -> str:
    """sha256 of ``data`` as canonical JSON (sorted keys, no spaces)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def strict_json(value: Any) -> Any:
    """``value`` (a source's metadata) with every float that is not finite, at any depth, as its text
    (``"nan"``, ``"inf"``, ``"-inf"``): JSON has no such numbers, and a manifest is read by strict
    JSON parsers too (browsers, ``jq``)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    return value


def _digest_dict(value: Any) -> dict[str, Any]:
    """``content_digest`` as read: a dict whose ``columns`` is a dict, else ``ValueError``."""
    if not isinstance(value, dict) or not isinstance(value.get("columns", {}), dict):
        raise ValueError("'content_digest'")
    return value


def _env_dict(value: Any) -> dict[str, Any]:
    """``env`` as read: a dict whose ``spec`` is a JSON object, else ``ValueError``."""
    if not isinstance(value, dict) or not isinstance(value.get("spec", {}), dict):
        raise ValueError("'env'")
    return value


def _card_dict(value: Any) -> dict[str, Any]:
    """``card`` as read: a JSON object, else ``ValueError``."""
    if not isinstance(value, dict):
        raise ValueError("'card'")
    return value


def manifest_text(manifest: Manifest, *, compact: bool = False) -> str:
    """``manifest.json``'s text: the manifest and its own digest (:data:`SELF_DIGEST`); ``compact``
    is one line (the indented encoder cost a fifth of a small commit's CPU)."""
    data = manifest.to_dict()
    data[SELF_DIGEST] = canonical_sha256(data)
    return json.dumps(data, indent=None if compact else 2, sort_keys=False) + "\n"


def write_manifest(directory: Path, manifest: Manifest, *, fsync: bool, compact: bool = False) -> None:
    """Write :func:`manifest_text` atomically (temp file + rename) into ``directory``."""
    text = manifest_text(manifest, compact=compact)
    # one writer per build folder: a fixed temp name; the folder is fsynced after the rename
    atomic_write(directory / MANIFEST_FILE, text, fsync=fsync, sync_dir=fsync, unique=False)


def read_manifest(directory: Path) -> Manifest:
    """Read and check the manifest of a published dataset directory.

    Raises:
        FileNotFoundError: No manifest.
        CorruptDatasetError: It cannot be read or fails a check.
    """
    path = directory / MANIFEST_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:
        raise CorruptDatasetError(f"cannot read manifest {path}: {exc}") from exc
    manifest = parse_manifest(text, path)
    named = manifest.name.replace("/", "--")
    if (
        directory.parent.name == DATASETS_DIR
        and directory.name != named
        and not _same_folder(directory, named)
    ):
        # a manifest copied from another dataset: its settings (a capacity) would act on these files
        raise CorruptDatasetError(
            f"manifest {path} names dataset {manifest.name!r}, not the one of its folder",
            hint=damage_hint(directory.name.replace("--", "/")),
        )
    return manifest


def _same_folder(directory: Path, name: str) -> bool:
    """Whether ``name`` beside ``directory`` is ``directory`` itself: its own name, or another
    spelling on a case-insensitive file system (``open_dataset("Foo")`` of the dataset ``foo``)."""
    if directory.name == name:
        return True
    try:
        return os.path.samefile(directory, directory.parent / name)
    except OSError:
        return False


def manifest_json(text: str | bytes, path: Path | str) -> dict[str, Any]:
    """A manifest's JSON object, unchecked (for reading one field of any manifest version);
    ``path`` names it in messages.

    Raises:
        CorruptDatasetError: ``text`` is no JSON object.
    """
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        raise CorruptDatasetError(f"cannot read manifest {path}: {exc}") from exc
    return data


def parse_manifest(text: str | bytes, path: Path | str) -> Manifest:
    """Parse and check a manifest's JSON; ``path`` (a file or URL) names it in messages.

    Raises:
        CorruptDatasetError: Not an rlds manifest, a newer format, or a failed check.
    """
    data = manifest_json(text, path)
    if data.get("format") != FORMAT_NAME:
        raise CorruptDatasetError(f"{path} is not an rlds manifest (format={data.get('format')!r})")
    version = data.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CorruptDatasetError(
            f"{path} has format_version {version!r}, newer than this rlds understands ({FORMAT_VERSION})",
            hint="upgrade rlds-cli ('pip install -U rlds-cli')",
        )
    _check_own_digest(data, path)
    check_manifest_data(data, path)
    try:
        manifest = Manifest.from_dict(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptDatasetError(
            f"manifest {path} is malformed: missing or bad {exc}", hint=damage_hint(manifest_name(data, path))
        ) from exc
    # keys become file paths: refuse ones escaping the dataset directory ('../../other/arrays/x')
    for key in manifest.fields:
        problem = key_problem(key)
        if problem is not None:
            raise CorruptDatasetError(
                f"manifest {path} names the array key {key!r}, which is no safe path: {problem}"
            )
    return manifest


def _check_own_digest(data: dict[str, Any], path: Path | str) -> None:
    """Take :data:`SELF_DIGEST` out of ``data`` and check it; without one (an older rlds's manifest),
    refuse a key no rlds writes.

    Raises:
        CorruptDatasetError: The digest differs (a byte changed since rlds wrote the file), or a key
            is unknown.
    """
    recorded = data.pop(SELF_DIGEST, None)
    hint = damage_hint(manifest_name(data, path))
    if recorded is not None:
        if recorded != canonical_sha256(data):
            raise CorruptDatasetError(
                f"manifest {path} does not match its own digest ({SELF_DIGEST}): it changed after rlds "
                "wrote it",
                hint=hint,
            )
        return
    unknown = sorted(set(data) - MANIFEST_KEYS)
    if unknown:
        raise CorruptDatasetError(f"manifest {path} holds {unknown[0]!r}, a key no rlds writes", hint=hint)
