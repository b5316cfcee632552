"""The TED vocabulary shared by every layer (keys, blocks, batches and the stored dtypes), and the
TED episode rules.

Key names and grammar (:func:`key_problem`), the block a reader streams into the cache
(:class:`StepBlock`), the stored dtypes (:func:`is_numeric`), the episode index's dtype, and the
batch mapping every read returns (:class:`TedBatch`). Imports nothing of the package.

The TED episode rules: one row per step per key, and ``done`` exactly at each episode's end.

``done`` is ``next/terminated | next/truncated``.

Each rule returns a :class:`Problem` or ``None`` and never raises; :mod:`rlds_cli.cache.builder`,
:mod:`rlds_cli.write.validate` and :mod:`rlds_cli.inspection.validate` word their own errors.
Rules are vectorised over rows. Episode ends are StepBlock's ``ends``: the sorted positions of
each episode's last step (inclusive).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

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


#: Keys every batch read from a dataset carries itself (each row's step; ``episode`` is a derived
#: key, recomputed from the episode index): never stored, or a Loader's and a TorchRL storage's
#: batches would hide the stored values.
BATCH_KEYS = ("index",)


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


def join_keys(keys: Iterable[str | tuple[str, ...]], what: str = "keys") -> list[str]:
    """A list of keys as :func:`join_key` strings; a single string (``keys="observation"``, read
    letter by letter) is refused as ``ValueError`` naming ``what``."""
    if isinstance(keys, str):
        raise ValueError(f"{what} takes a list of keys, not the string {keys!r}: pass [{keys!r}]")
    return [join_key(k) for k in keys]


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


#: What to give where a value is no array of numbers (:func:`as_numbers`).
NUMBERS_HINT = (
    "give numpy arrays or CPU tensors of bool, integers or floats, the same shape every row "
    "(a bfloat16 tensor: .float() first)"
)


def as_numbers(value: Any) -> tuple[np.ndarray | None, str | None]:
    """``value`` as a numpy array of numbers (a torch tensor detached and on the CPU, without
    importing torch), or ``None`` and why not in words: a ragged list, a tensor numpy cannot
    hold (bfloat16, the meta device), strings or objects. Never raises."""
    given = f"values of type {type(value).__name__}"
    try:
        if hasattr(value, "detach") and hasattr(value, "cpu"):
            value = value.detach().cpu().numpy()
        arr = np.asarray(value)
    except (TypeError, ValueError, NotImplementedError, RuntimeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        return None, f"{given} are not an array of numbers ({type(exc).__name__}: {first})"
    if not is_numeric(arr.dtype):  # objects, strings, dates, records
        return None, f"{given} are {describe_dtype(arr.dtype)}, not an array of numbers"
    return arr, None


def group_clash(keys: Iterable[str]) -> tuple[str, str] | None:
    """A key that is also a group of others (``feat`` and ``feat/x``: a file cannot be a folder
    too), as ``(group, member)``; ``None`` when there is none."""
    for a, b in itertools.pairwise(sorted(keys)):
        if b.startswith(a + "/"):
            return a, b
    return None


#: Kinds of :class:`Problem`.
Kind = Literal["missing keys", "rows", "ends", "no steps", "done before end", "end not done"]


#: Required step keys are absent (:attr:`Problem.keys` names them).
MISSING_KEYS: Final = "missing keys"


#: A key has not the rows expected (:attr:`Problem.rows` is ``None`` for a 0-d value).
ROWS: Final = "rows"


#: Episode ends that are not sorted, unique and inside the rows.
ENDS: Final = "ends"


#: An episode without a step.
NO_STEPS: Final = "no steps"


#: ``done`` is set on a step that is not its episode's last.
DONE_BEFORE_END: Final = "done before end"


#: An episode's last step has ``done`` false.
END_NOT_DONE: Final = "end not done"


@dataclass(frozen=True)
class Problem:
    """One break of an episode rule.

    Attributes:
        kind: Which rule (:data:`MISSING_KEYS`, :data:`ROWS`, :data:`ENDS`, :data:`NO_STEPS`,
            :data:`DONE_BEFORE_END`, :data:`END_NOT_DONE`).
        key: The key at fault, for :data:`ROWS`.
        step: The step at fault (position in the rows checked), for the ``done`` rules.
        episode: The episode of that step, counted from the one open at the first row checked.
        rows: The rows the key has (``None``: a 0-d value without a row axis).
        expected: The rows it should have.
        keys: The keys missing, for :data:`MISSING_KEYS`.
    """

    kind: Kind
    key: str | None = None
    step: int | None = None
    episode: int | None = None
    rows: int | None = None
    expected: int | None = None
    keys: tuple[str, ...] = ()


def missing_step_keys(keys: Collection[str]) -> Problem | None:
    """The required step keys (:data:`~rlds_cli.cache.ted.REQUIRED_STEP_KEYS`, in order) that
    ``keys`` lacks; a group (``action/0``, ``action/goal``) counts as its key."""
    missing = tuple(
        k for k in REQUIRED_STEP_KEYS if k not in keys and not any(s.startswith(f"{k}/") for s in keys)
    )
    return Problem(MISSING_KEYS, keys=missing) if missing else None


def rows_problem(columns: Mapping[str, Any], expected: int) -> Problem | None:
    """The first column (in mapping order) without ``expected`` rows, or a 0-d one."""
    for key, values in columns.items():
        shape = np.shape(values)
        if not shape or shape[0] != expected:
            return Problem(ROWS, key=key, rows=int(shape[0]) if shape else None, expected=expected)
    return None


def ends_problem(ends: np.ndarray, n: int) -> Problem | None:
    """Whether ``ends`` are sorted, unique and inside ``[0, n)``."""
    if len(ends) and (ends[0] < 0 or ends[-1] >= n or np.any(np.diff(ends) <= 0)):
        return Problem(ENDS, expected=n)
    return None


def last_steps(ends: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Whether each step of ``[start, stop)`` is its episode's last, from sorted ``ends`` (which
    may cover a wider range)."""
    ends = np.asarray(ends)
    last = np.zeros(stop - start, bool)
    lo, hi = np.searchsorted(ends, [start, stop])
    last[ends[lo:hi] - start] = True
    return last


def done_mismatches(done: np.ndarray, last: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every break of the ``done`` rule as positions: ``(early, unended)``: steps done before
    their episode's last, and last steps not done.

    Args:
        done: ``next/terminated | next/truncated`` of each step, ``(n,)`` bool.
        last: Whether each step is its episode's last (:func:`last_steps`), ``(n,)`` bool.
    """
    return np.flatnonzero(done & ~last), np.flatnonzero(last & ~done)


def done_problem(done: np.ndarray, last: np.ndarray) -> Problem | None:
    """The first step (of either kind of :func:`done_mismatches`) where ``done`` differs from
    ``last``; ``None`` when ``done`` is true exactly at the episodes' last steps."""
    if np.array_equal(done, last):  # the common case: one pass, nothing allocated
        return None
    step = int(np.flatnonzero(done != last)[0])
    kind: Kind = END_NOT_DONE if last[step] else DONE_BEFORE_END
    return Problem(kind, step=step, episode=int(np.count_nonzero(last[:step])))


def episode_done_problem(done: np.ndarray) -> Problem | None:
    """The ``done`` rule for one whole episode: :data:`NO_STEPS` if empty, :data:`END_NOT_DONE`
    if its last step is not done (checked first), :data:`DONE_BEFORE_END` at the first early
    done."""
    n = len(done)
    if n == 0:
        return Problem(NO_STEPS)
    if not done[-1]:
        return Problem(END_NOT_DONE, step=n - 1, episode=0)
    if done[:-1].any():
        return Problem(DONE_BEFORE_END, step=int(np.flatnonzero(done)[0]), episode=0)
    return None
