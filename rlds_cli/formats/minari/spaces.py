"""Minari's spaces in their JSON form (``minari.serialization``): the leaves a space splits into,
the per-step shape of a Box/MultiDiscrete/MultiBinary space, and the image spaces whose frames
Minari >= 0.5.3 stores as JPEG bytes (kept as they are: :class:`~rlds_cli.frames.encoded.EncodedFrames`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.errors import FrameError, SourceFormatError
from rlds_cli.frames.codecs import FrameFormat, image_format
from rlds_cli.frames.encoded import EncodedFrames

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
    """An array read for every episode: where it is in the episode and its TED key.

    ``path`` is the HDF5 path in the episode group (``observations/_index_0``, ``infos/x``); for
    the arrow storage ``fields`` are the struct fields to follow inside the column ``path``
    starts with.
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
    """JPEG bytes per frame (byte strings, or uint8 arrays of them), as minari stores an image
    space's frames, kept as they are: each frame's header is checked to be a JPEG of the space's
    ``shape`` (what minari's loader decodes them to), its pixels are decoded when read."""
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
        if found.image_shape != fmt.image_shape or found.codec != "jpeg":
            raise SourceFormatError(
                f"{path}: {label} frame {j} is a {found.codec} image of {found.image_shape}, the space "
                f"says {tuple(shape)}"
            )
    return EncodedFrames(blobs, fmt)
