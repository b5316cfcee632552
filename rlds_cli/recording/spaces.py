"""Gymnasium spaces -> TED keys, with the key mapping rlds's Minari reader uses.

A recorded observation or action is split into leaves exactly as ``formats/minari/layout.py`` splits
a Minari dataset, so data recorded by rlds and data recorded by Minari's ``DataCollector`` then
converted have the same keys, shapes, dtypes and values:

* a Dict space becomes ``<role>/<key>`` (nested Dicts nest further), a Tuple space ``<role>/0``,
  ``<role>/1``...; any other space is the leaf ``<role>`` itself;
* names are cleaned into TED keys by the same cleaner (``formats/keys.py``);
* Box values are stored in the space's dtype, Discrete values as ``int64`` (what Minari writes:
  gymnasium's Discrete samples are ``np.int64``), MultiDiscrete in the space's dtype and MultiBinary
  as ``int8``;
* Text values are stored as ``uint32`` Unicode code points of shape ``(max_length,)``, zero padded
  (the cache is numeric; the Minari reader drops text columns); :func:`decode_text` gives the
  strings back.

:func:`serialize_space` writes the JSON form of ``minari.serialization.serialize_space`` without
minari, so the manifest holds the spaces as a converted Minari dataset does and
``rlds export --to minari`` writes them back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlds_cli.errors import RecordingError
from rlds_cli.formats.keys import clean_keys

#: Where each role's leaves live in a Minari episode group (``observations/_index_0``).
MINARI_PREFIX = {"observation": "observations", "action": "actions"}


@dataclass(frozen=True)
class Leaf:
    """One array of a space: its TED key, Minari path, the leaf space and how a value is read.

    ``path`` is the sequence of Dict keys / Tuple indices from the whole value to this leaf.
    """

    key: str
    minari_path: str
    space: Any
    path: tuple[str | int, ...]
    kind: str  # Box | Discrete | MultiDiscrete | MultiBinary | Text
    dtype: np.dtype[Any]
    shape: tuple[int, ...]


def space_leaves(space: Any, role: str) -> list[Leaf]:
    """The leaves of ``space`` (a gymnasium space) for ``role`` (``observation`` or ``action``).

    Raises:
        RecordingError: the space (or one inside it) is a kind rlds cannot store (Graph,
            Sequence, OneOf, or a space of another library), or two of its leaves flatten to
            the same path (a Dict key ``'a/b'`` beside a Dict ``'a'`` holding ``'b'``).
    """
    raw: list[tuple[tuple[str, ...], str, Any, tuple[str | int, ...]]] = []
    _walk(space, (role,), MINARI_PREFIX[role], (), raw)
    _refuse_collisions(raw, role)
    cleaned = clean_keys({minari: parts for parts, minari, _, _ in raw})
    leaves = []
    for _parts, minari, sub, path in raw:
        kind = type(sub).__name__
        dtype, shape = leaf_format(sub, f"{role} space")
        leaves.append(Leaf(cleaned[minari], minari, sub, path, kind, dtype, shape))
    return leaves


def _refuse_collisions(raw: list[tuple[tuple[str, ...], str, Any, tuple[str | int, ...]]], role: str) -> None:
    """Refuse two leaves whose flattened (Minari) paths are the same: one would silently overwrite
    the other."""
    seen: dict[str, tuple[str | int, ...]] = {}
    for _parts, minari, _sub, path in raw:
        if minari in seen:
            raise RecordingError(
                f"{role} space: the leaves {value_path(role, seen[minari])} and {value_path(role, path)} "
                f"both flatten to {minari!r}; one would overwrite the other",
                hint="rename the Dict key that holds '/' (or the one that equals another's text) so "
                "that every leaf has its own path",
            )
        seen[minari] = path


def value_path(role: str, path: tuple[str | int, ...]) -> str:
    """Where a leaf sits in a value, written as Python indexing: ``observation['a']['b']``."""
    return role + "".join(f"[{part!r}]" for part in path)


def _walk(
    space: Any,
    parts: tuple[str, ...],
    minari: str,
    path: tuple[str | int, ...],
    out: list[tuple[tuple[str, ...], str, Any, tuple[str | int, ...]]],
) -> None:
    from gymnasium import spaces

    if isinstance(space, spaces.Dict):
        for name, sub in space.spaces.items():
            _walk(sub, (*parts, str(name)), f"{minari}/{name}", (*path, name), out)
    elif isinstance(space, spaces.Tuple):
        for j, sub in enumerate(space.spaces):
            _walk(sub, (*parts, str(j)), f"{minari}/_index_{j}", (*path, j), out)
    else:
        out.append((parts, minari, space, path))


def leaf_format(space: Any, where: str) -> tuple[np.dtype[Any], tuple[int, ...]]:
    """The dtype and per-step shape a leaf space is stored with."""
    from gymnasium import spaces

    if isinstance(space, spaces.Box):
        return np.dtype(space.dtype), tuple(space.shape)
    if isinstance(space, spaces.Discrete):
        return np.dtype(np.int64), ()
    if isinstance(space, spaces.MultiDiscrete):
        return np.dtype(space.dtype), tuple(space.shape)
    if isinstance(space, spaces.MultiBinary):
        return np.dtype(np.int8), tuple(space.shape)
    if isinstance(space, spaces.Text):
        return np.dtype(np.uint32), (int(space.max_length),)
    raise RecordingError(
        f"{where}: {type(space).__name__} spaces cannot be recorded",
        hint="rlds records Box, Discrete, MultiDiscrete, MultiBinary, Text, Dict and Tuple spaces",
    )


def getter(leaf: Leaf) -> Callable[[Any], Any]:
    """A function from a whole value (observation or action) to this leaf's value, built once per
    leaf so a step costs one call per leaf."""
    path = leaf.path
    if not path:
        return lambda value: value
    if len(path) == 1:
        (a,) = path
        return lambda value: value[a]
    if len(path) == 2:
        a, b = path
        return lambda value: value[a][b]

    def get(value: Any) -> Any:
        for part in path:
            value = value[part]
        return value

    return get


def encode_text(values: list[Any], max_length: int, key: str) -> np.ndarray:
    """Strings -> ``uint32`` code points, ``(len(values), max_length)``, zero padded."""
    out = np.zeros((len(values), max_length), np.uint32)
    for i, text in enumerate(values):
        if not isinstance(text, str):
            raise RecordingError(f"{key}: step {i} holds a {type(text).__name__}, the Text space needs a str")
        if len(text) > max_length:
            raise RecordingError(
                f"{key}: step {i} holds {len(text)} characters, the Text space allows {max_length}"
            )
        if "\x00" in text:
            raise RecordingError(f"{key}: step {i} holds a NUL character, which marks the padding")
        out[i, : len(text)] = np.frombuffer(text.encode("utf-32-le"), np.uint32)
    return out


def decode_text(codes: np.ndarray) -> list[str]:
    """``uint32`` code points (one row per string, zero padded) -> the strings."""
    rows = np.asarray(codes, np.uint32).reshape(len(codes), -1)
    return [row[row != 0].astype("<u4").tobytes().decode("utf-32-le") for row in rows]


def stack_leaf(leaf: Leaf, values: list[Any], key: str) -> np.ndarray:
    """One leaf's values over an episode as one array of the leaf's dtype and shape."""
    if leaf.kind == "Text":
        return encode_text(values, leaf.shape[0], key)
    arr: np.ndarray | None = None
    problem = ""
    try:
        arr = np.asarray(values, dtype=leaf.dtype) if values else np.zeros((0, *leaf.shape), leaf.dtype)
    except (TypeError, ValueError) as exc:
        problem = str(exc)
    if arr is None or arr.shape[1:] != leaf.shape:
        # name the first value that does not fit (the reset observation is row 0)
        bad = next((i for i, v in enumerate(values) if np.shape(v) != leaf.shape), None)
        where = f"row {bad} has shape {np.shape(values[bad])}" if bad is not None else problem
        raise RecordingError(
            f"{key}: values do not fit the {leaf.kind} space of shape {leaf.shape} ({where})",
            hint="the environment returned values outside its declared space",
        )
    if leaf.dtype.kind in "biu" and values:
        _require_exact(arr, values, leaf, key)
    return arr


def _require_exact(arr: np.ndarray, values: list[Any], leaf: Leaf, key: str) -> None:
    """Refuse values the leaf's integer (or bool) dtype does not hold exactly (numpy's cast wraps
    300 into a uint8 44 and cuts a Discrete 1.7 to 1)."""
    given = np.asarray(values)
    if given.dtype.kind not in "biuf" or given.shape != arr.shape:
        return
    same = (given == arr).reshape(len(arr), -1).all(axis=1)
    if not same.all():
        row = int(np.flatnonzero(~same)[0])
        raise RecordingError(
            f"{key}: row {row} holds {given[row].tolist()!r}, which the {leaf.kind} space's "
            f"{leaf.dtype} values cannot hold (they would be stored as {arr[row].tolist()!r})",
            hint="the environment returned values outside its declared space",
        )


def serialize_space(space: Any) -> dict[str, Any]:
    """``space`` in the JSON form of ``minari.serialization.serialize_space`` (as an object)."""
    from gymnasium import spaces

    if isinstance(space, spaces.Box):
        return {
            "type": "Box",
            "dtype": str(space.dtype),
            "shape": list(space.shape),
            "low": space.low.tolist(),
            "high": space.high.tolist(),
        }
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "dtype": "int64", "start": int(space.start), "n": int(space.n)}
    if isinstance(space, spaces.MultiDiscrete):
        return {
            "type": "MultiDiscrete",
            "dtype": str(space.dtype),
            "nvec": space.nvec.tolist(),
            "start": space.start.tolist(),
        }
    if isinstance(space, spaces.MultiBinary):
        n = space.n
        return {"type": "MultiBinary", "n": n.tolist() if isinstance(n, np.ndarray) else n}
    if isinstance(space, spaces.Dict):
        return {"type": "Dict", "subspaces": {k: serialize_space(s) for k, s in space.spaces.items()}}
    if isinstance(space, spaces.Tuple):
        return {"type": "Tuple", "subspaces": [serialize_space(s) for s in space.spaces]}
    if isinstance(space, spaces.Text):
        return {
            "type": "Text",
            "max_length": space.max_length,
            "min_length": space.min_length,
            "charset": space.characters,
        }
    leaf_format(space, "space")  # raises the error that names the kind
    raise AssertionError("unreachable")
