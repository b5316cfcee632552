"""The TED vocabulary shared by every layer: keys, blocks, batches and the stored dtypes.

Key names and grammar (:func:`key_problem`), the block a reader streams into the cache
(:class:`StepBlock`), the stored dtypes (:func:`is_numeric`), the episode index's dtype, and the
batch mapping every read returns (:class:`TedBatch`). Imports nothing of the package.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

#: One part of a TED key (see :func:`key_problem`).
_PART = re.compile(r"[A-Za-z0-9_.-]+")
#: Longest part of a key: with the ``.npy`` suffix a file name stays far below the 255 bytes
#: filesystems allow.
MAX_KEY_PART_CHARS = 200
#: Most parts in a key (directory levels under ``arrays/``).
MAX_KEY_PARTS = 32


def key_problem(key: object) -> str | None:
    """What makes ``key`` break the strict TED key grammar, or ``None`` when it follows it.

    The grammar: ``/``-separated parts (at most :data:`MAX_KEY_PARTS`), each 1 to
    :data:`MAX_KEY_PART_CHARS` of ``A-Z a-z 0-9 _ . -`` and neither ``.`` nor ``..``; such a key
    is a relative path that stays below the directory it is joined to.
    """
    if not isinstance(key, str):
        return f"it is a {type(key).__name__}, not a string"
    parts = key.split("/")
    if len(parts) > MAX_KEY_PARTS:
        return f"it has {len(parts)} '/'-separated parts (at most {MAX_KEY_PARTS})"
    for part in parts:
        if not part:
            return "it has an empty part (a leading, trailing or doubled '/')"
        if part in (".", ".."):
            return f"it has a {part!r} part"
        if len(part) > MAX_KEY_PART_CHARS:
            return f"a part is {len(part)} characters long (at most {MAX_KEY_PART_CHARS})"
        if not _PART.fullmatch(part):
            return f"part {part!r} has characters other than A-Z a-z 0-9 _ . -"
    return None


def is_valid_key(key: str) -> bool:
    """Whether ``key`` follows the strict TED key grammar (see :func:`key_problem`)."""
    return key_problem(key) is None


#: One row per episode in ``episodes.npy``: its first step, its length, the source's own id, and
#: whether its final observation is the real one.
EPISODE_DTYPE = np.dtype([("start", "<i8"), ("length", "<i8"), ("source_id", "<i8"), ("final_known", "?")])

#: Keys every block must carry (per step, N rows).
REQUIRED_STEP_KEYS = ("action", "next/reward", "next/terminated", "next/truncated")


def column(values: np.ndarray) -> np.ndarray:
    """A per-step scalar as TED's ``[N, 1]`` column (``(N,)`` gains the trailing axis)."""
    values = np.asarray(values)
    return values[:, None] if values.ndim == 1 else values


@dataclass
class StepBlock:
    """A run of consecutive transitions, in the flat layout the cache stores.

    Attributes:
        steps: Per-step columns with ``n`` rows each (``action``, ``next/reward``,
            ``next/terminated``, ``next/truncated``, ``info/...``).
        observations: Observation-like columns in flat layout: the observation of each step,
            plus each ending episode's final observation right after its last step
            (``n + len(ends)`` rows).
        ends: Sorted positions (in ``[0, n)``) of the last step of each episode that ends in
            this block. An episode may start in an earlier block.
        final_known: Per end, whether the final observation is the real one (``False`` where a
            format rule had to fill it in; see ``docs/formats.md``). ``None`` means all real.
        episode_ids: Per end, the source's own id of that episode (``None``: numbered in order).
    """

    steps: Mapping[str, np.ndarray]
    observations: Mapping[str, np.ndarray]
    ends: np.ndarray
    final_known: np.ndarray | None = None
    episode_ids: np.ndarray | None = None

    @property
    def num_steps(self) -> int:
        return int(next(iter(self.steps.values())).shape[0]) if self.steps else 0


def join_key(key: str | tuple[str, ...]) -> str:
    """``("next", "reward")`` -> ``"next/reward"``; strings pass through."""
    return "/".join(key) if isinstance(key, tuple) else key


class TedBatch(dict[str, Any]):
    """A flat mapping from TED paths (``"next/reward"``) to arrays.

    Nested access works too: ``batch["next", "reward"] is batch["next/reward"]``.
    """

    def __getitem__(self, key: str | tuple[str, ...]) -> Any:
        return super().__getitem__(join_key(key))

    def __contains__(self, key: object) -> bool:
        return super().__contains__(join_key(key) if isinstance(key, tuple | str) else key)

    def get(self, key: str | tuple[str, ...], default: Any = None) -> Any:
        return super().get(join_key(key), default)

    @property
    def batch_size(self) -> int:
        """Number of rows (the first dimension shared by every entry)."""
        return int(next(iter(self.values())).shape[0]) if self else 0

    def nested(self) -> dict[str, Any]:
        """The same data as nested dicts: ``{"next": {"reward": ...}, ...}``."""
        out: dict[str, Any] = {}
        for path, value in self.items():
            node = out
            *parents, leaf = path.split("/")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        return out

    def to_numpy(self) -> TedBatch:
        """A copy with every entry as an in-memory numpy array (no memory maps)."""
        return TedBatch({k: np.array(v) for k, v in self.items()})


#: The dtype kinds the cache stores: bool, integers, floats, complex.
NUMERIC_KINDS = "biufc"


def describe_dtype(dtype: np.dtype) -> str:
    """A dtype in words, for messages (``fixed-width byte strings (|S4)``)."""
    dtype = np.dtype(dtype)
    if dtype.fields is not None:
        return f"structured (compound) records ({dtype})"
    if dtype.subdtype is not None:
        return f"sub-array elements ({dtype})"
    if dtype.metadata and dtype.metadata.get("vlen") in (str, bytes):  # how h5py marks its string dtypes
        return "variable-length strings"
    words = {
        "S": "fixed-width byte strings",
        "U": "fixed-width unicode strings",
        "O": "Python objects or variable-length values",
        "V": "opaque (void) bytes",
        "M": "dates",
        "m": "time deltas",
    }
    return f"{words.get(dtype.kind, 'non-numeric values')} ({dtype.str})"


def is_numeric(dtype: np.dtype) -> bool:
    """Whether the cache can store values of ``dtype`` (bool, integer, float, complex)."""
    dtype = np.dtype(dtype)
    return dtype.kind in NUMERIC_KINDS and dtype.fields is None and dtype.subdtype is None
