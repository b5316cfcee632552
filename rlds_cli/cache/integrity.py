"""The checks a dataset's two small files pass before anything is read through them.

``manifest.json`` and ``episodes.npy`` steer every read, so a damaged one is refused at open
(:func:`rlds_cli.cache.manifest.parse_manifest`, :class:`rlds_cli.cache.dataset.Dataset`), never
served. The checks are O(fields) and O(episodes) (vectorized: about 6 ms for a million episodes)
and raise one :class:`~rlds_cli.errors.CorruptDatasetError` naming the file and the problem.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlds_cli.cache.layout import SEGMENTED_LAYOUT, VIEW_LAYOUT
from rlds_cli.cache.ted import EPISODE_DTYPE, REQUIRED_STEP_KEYS
from rlds_cli.errors import CorruptDatasetError

if TYPE_CHECKING:
    from rlds_cli.cache.manifest import Manifest

__all__ = ["check_episode_index", "check_manifest_data", "damage_hint", "manifest_name", "schema_problem"]

_STORAGES = ("flat", "step")
#: Optional top-level entries and the JSON type each must have when present.
_OPTIONAL_TYPES: dict[str, type] = {
    "source": dict,
    "conversion": dict,
    "lineage": list,
    "stats": dict,
    "content_digest": dict,
    "env": dict,
    "created_by": str,
    "created_at": str,
    "layout": str,
}


def damage_hint(name: str) -> str:
    """What to do about a damaged dataset called ``name`` (of any kind: ``rlds verify`` names the
    command that makes that kind again)."""
    return (
        f"run 'rlds verify {name}': it names every damaged file and how to make this dataset again; "
        f"or remove it ('rlds rm {name}')"
    )


def _is_count(value: Any) -> bool:
    """A JSON integer >= 0 (``True`` is an ``int`` to Python, not a count)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def manifest_name(data: dict[str, Any], path: Path | str) -> str:
    """The dataset's name for the hint: the manifest's own, else its folder's."""
    name = data.get("name")
    if isinstance(name, str) and name:
        return name
    parts = str(path).rstrip("/").replace("\\", "/").split("/")
    return parts[-2] if len(parts) >= 2 and parts[-2] else "NAME"


def check_manifest_data(data: dict[str, Any], path: Path | str) -> None:
    """Check a parsed manifest's entries (types, ranges, declared fields) before it is used.

    Args:
        data: The manifest's JSON object (its ``format`` and ``format_version`` already checked).
        path: Where it came from (a file or a URL), named in the error.

    Raises:
        CorruptDatasetError: The first problem found, naming ``path``.
    """
    hint = damage_hint(manifest_name(data, path))

    def bad(what: str) -> CorruptDatasetError:
        return CorruptDatasetError(f"manifest {path} is malformed: {what}", hint=hint)

    for key in ("name", "backend"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise bad(f"{key!r} must be a non-empty string, got {data.get(key)!r}")
    from rlds_cli.cache.backends import BACKENDS  # lazily: the backends import zarr helpers

    if data["backend"] not in BACKENDS:
        raise bad(f"'backend' is {data['backend']!r}, not one of {', '.join(BACKENDS)}")
    for key in ("num_steps", "num_episodes"):
        if not _is_count(data.get(key)):
            raise bad(f"{key!r} must be an integer >= 0, got {data.get(key)!r}")
    if data["num_episodes"] > data["num_steps"]:  # every episode has at least one step
        raise bad(f"{data['num_episodes']} episodes cannot fit in {data['num_steps']} steps")
    for key, kind in _OPTIONAL_TYPES.items():
        if key in data and not isinstance(data[key], kind):
            raise bad(
                f"{key!r} must be a JSON {'object' if kind is dict else kind.__name__}, "
                f"got {type(data[key]).__name__}"
            )
    fields = data.get("fields")
    if not isinstance(fields, dict):
        raise bad(f"'fields' must be a JSON object of key -> spec, got {type(fields).__name__}")
    for key, spec in fields.items():
        problem = _field_problem(spec)
        if problem is not None:
            raise bad(f"field {key!r}: {problem}")
    framed = [k for k, s in fields.items() if s.get("codec", "raw") != "raw"]
    if framed and data.get("format_version", 1) < 2:  # version 2 added frame columns
        version = data.get("format_version")
        raise bad(f"format_version {version} cannot hold frame columns ({framed[0]!r} has a codec)")
    layout = data.get("layout", "flat-ted")
    if layout in (VIEW_LAYOUT, SEGMENTED_LAYOUT):
        return  # a view's fields are its parent's; a growing dataset's head may not know them all yet
    # a Dict/Tuple action space is stored under 'action/...' (as the builder allows)
    missing = [
        k for k in REQUIRED_STEP_KEYS if k not in fields and not any(f.startswith(f"{k}/") for f in fields)
    ]
    if missing:
        raise bad(f"it declares no {', '.join(repr(k) for k in missing)} (every TED dataset stores them)")
    if not any(isinstance(s, dict) and s.get("storage") == "flat" for s in fields.values()):
        raise bad("it declares no observation-like field (storage 'flat')")


def _field_problem(spec: Any) -> str | None:
    """What is wrong with one field's ``{shape, dtype, storage}`` (``None``: nothing)."""
    if not isinstance(spec, dict):
        return f"its spec must be a JSON object, got {type(spec).__name__}"
    shape = spec.get("shape")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        return f"'shape' must be a list of integers >= 0, got {shape!r}"
    dtype = spec.get("dtype")
    if not isinstance(dtype, str):
        return f"'dtype' must be a string, got {dtype!r}"
    try:
        np_dtype = np.dtype(dtype)
    except (TypeError, ValueError):
        return f"'dtype' {dtype!r} is no numpy dtype"
    if np_dtype.hasobject:  # a memory map of pointers: never read as data
        return f"'dtype' {dtype!r} holds Python objects"
    if spec.get("storage") not in _STORAGES:
        return f"'storage' must be one of {', '.join(_STORAGES)}, got {spec.get('storage')!r}"
    codec = spec.get("codec", "raw")
    if codec != "raw" and spec.get("storage") != "flat":
        return f"'codec' {codec!r} on a per-step field (frames are observations: storage 'flat')"
    if codec != "raw":
        from rlds_cli.frames.codecs import CODECS, frame_shape_problem

        if codec not in CODECS:
            return f"'codec' must be raw or one of {', '.join(CODECS)}, got {codec!r}"
        if np_dtype != np.uint8:
            return f"'codec' {codec!r} needs dtype uint8, got {dtype!r}"
        if not isinstance(spec.get("channels_first", False), bool):
            return f"'channels_first' must be true or false, got {spec.get('channels_first')!r}"
        problem = frame_shape_problem(tuple(shape), bool(spec.get("channels_first", False)), codec)
        if problem is not None:
            return f"'shape' {shape} cannot be {codec} frames: {problem}"
    return None


def check_episode_index(
    index: Any, num_steps: int, num_episodes: int, path: Path | str, *, name: str | None = None
) -> np.ndarray:
    """Check an episode index as read from ``path`` against its manifest's counts.

    Required: dtype :data:`~rlds_cli.cache.ted.EPISODE_DTYPE`, one row per episode, lengths
    >= 1, episodes contiguous and in order from step 0, lengths summing to ``num_steps``.

    Args:
        index: The array loaded from ``episodes.npy``.
        num_steps: The manifest's step count.
        num_episodes: The manifest's episode count.
        path: The index file, named in the error.
        name: The dataset's name for the hint (default: the folder of ``path``).

    Returns:
        ``index``, checked.

    Raises:
        CorruptDatasetError: The first problem found, naming ``path``.
    """
    hint = damage_hint(name or Path(path).parent.name)

    def bad(what: str) -> CorruptDatasetError:
        return CorruptDatasetError(f"episode index {path} is damaged: {what}", hint=hint)

    if not isinstance(index, np.ndarray) or index.dtype != EPISODE_DTYPE or index.ndim != 1:
        got = f"{index.dtype}, {index.ndim}-d" if isinstance(index, np.ndarray) else type(index).__name__
        raise bad(f"its rows are {got}, not the episode index's {EPISODE_DTYPE}, 1-d")
    if len(index) != num_episodes:
        raise bad(f"it has {len(index)} episodes, the manifest says {num_episodes}")
    if not len(index):
        if num_steps:
            raise bad(f"it has no episodes, the manifest says {num_steps} steps")
        return index
    lengths, starts = index["length"], index["start"]
    short = np.flatnonzero(lengths < 1)
    if short.size:
        e = int(short[0])
        raise bad(f"episode {e} has length {int(lengths[e])} (every episode has at least one step)")
    long = np.flatnonzero(lengths > num_steps)
    if long.size:  # also keeps the sums below from overflowing
        e = int(long[0])
        raise bad(f"episode {e} has length {int(lengths[e])}, more than the {num_steps} steps of the dataset")
    if int(starts[0]) != 0:
        raise bad(f"episode 0 starts at step {int(starts[0])}, not 0")
    unordered = np.flatnonzero(starts[1:] <= starts[:-1])
    if unordered.size:
        e = int(unordered[0]) + 1
        raise bad(
            f"episode {e} starts at step {int(starts[e])}, not after episode {e - 1} "
            f"(step {int(starts[e - 1])}): starts must be strictly increasing"
        )
    ends = starts + lengths
    gap = np.flatnonzero(starts[1:] != ends[:-1])
    if gap.size:
        e = int(gap[0]) + 1
        raise bad(
            f"episode {e} starts at step {int(starts[e])}, not right after episode {e - 1} "
            f"(steps {int(starts[e - 1])}..{int(ends[e - 1]) - 1}): episodes are contiguous"
        )
    if int(ends[-1]) != num_steps:
        raise bad(f"its episodes hold {int(ends[-1])} steps, the manifest says {num_steps}")
    return index


def schema_problem(head: Manifest, segment: Manifest) -> str | None:
    """Why a segment's manifest does not fit its growing dataset's head manifest (backend, keys,
    each key's dtype, shape, storage and codec), or ``None``. A mismatch is damage, never cast."""
    if segment.backend != head.backend:
        return f"it is stored as {segment.backend}, the dataset as {head.backend}"
    if set(segment.fields) != set(head.fields):
        extra = sorted(set(segment.fields) - set(head.fields))
        missing = sorted(set(head.fields) - set(segment.fields))
        return f"its keys differ from the dataset's manifest's (its own: {extra}; the manifest's: {missing})"
    for key, spec in head.fields.items():
        own = segment.fields[key]
        same = np.dtype(own.dtype) == np.dtype(spec.dtype) and tuple(own.shape) == tuple(spec.shape)
        if not same or own.storage != spec.storage:
            return (
                f"key {key!r} is {own.dtype} {tuple(own.shape)} ({own.storage}) in the segment, "
                f"{spec.dtype} {tuple(spec.shape)} ({spec.storage}) in the dataset's manifest"
            )
        if (own.codec, own.channels_first) != (spec.codec, spec.channels_first):
            return (
                f"key {key!r} is stored as {own.codec} frames in the segment, as {spec.codec} in the "
                "dataset's manifest"
                + (" (and another channel order)" if own.channels_first != spec.channels_first else "")
            )
    return None
