"""What the user's function must return, checked chunk by chunk.

The returned mapping *is* the output chunk: keys it leaves out are dropped, except the
episode-structure flags ``next/terminated`` and ``next/truncated``, which are carried over from
the input when the row count is unchanged. ``next/done``, ``episode`` and ``index`` are derived
by the cache and never stored. A key ``K`` returned together with ``next/K`` is observation-like
and stored once (flat layout), which needs ``next/K[t] == K[t + 1]`` inside every episode.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlds_cli.cache.builder import dtype_name
from rlds_cli.cache.manifest import FieldSpec
from rlds_cli.cache.ted import NUMBERS_HINT, as_numbers, group_clash, key_problem
from rlds_cli.errors import OutputSchemaError

REQUIRED = ("action", "next/reward", "next/terminated", "next/truncated")
DERIVED = ("next/done", "episode", "index")
_SINGLETON = ("next/reward", "next/terminated", "next/truncated")
_FLAGS = ("next/terminated", "next/truncated")

Schema = dict[str, FieldSpec]


def _flatten(out: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in out.items():
        if not isinstance(key, str):
            raise OutputSchemaError(f"output key {key!r} is not a string")
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{path}/"))
        else:
            flat[path] = value
    return flat


def _as_array(key: str, value: Any) -> np.ndarray:
    problem = key_problem(key)
    if problem is not None:  # checked here, where the key is the function's, not the cache's
        raise OutputSchemaError(
            f"output key {key!r} cannot be stored: {problem}",
            hint="a key is '/'-separated parts of A-Z a-z 0-9 _ . - (not '.' or '..'); rename it",
        )
    arr, problem = as_numbers(value)
    if arr is None:
        raise OutputSchemaError(f"output key {key!r}: {problem}", hint=NUMBERS_HINT)
    if arr.ndim == 0:
        raise OutputSchemaError(f"output key {key!r} is a scalar; every value needs one row per step")
    if 0 in arr.shape[1:]:  # audit, the npz and torchrl exports failed on it; other readers drop it
        raise OutputSchemaError(
            f"output key {key!r} has per-step shape {arr.shape[1:]}: no value per step",
            hint="leave the key out of the returned batch",
        )
    if key in _SINGLETON and arr.ndim == 1:
        arr = arr[:, None]
    if key in _SINGLETON and arr.shape[1:] != (1,):
        raise OutputSchemaError(
            f"output key {key!r} has shape {arr.shape}: it is one value per step, (steps,) or (steps, 1)",
            hint="keep a vector reward's parts under info/... keys" if key == "next/reward" else None,
        )
    if key == "next/reward" and arr.dtype.kind not in "iuf":
        raise OutputSchemaError(f"output key 'next/reward' has dtype {arr.dtype}; a reward is a number")
    if key in _FLAGS and arr.dtype != np.bool_:
        if arr.dtype.kind not in "iu" or not np.isin(arr, (0, 1)).all():  # 0/1 integers are flags too
            raise OutputSchemaError(
                f"output key {key!r} is {arr.dtype} holding values other than 0 and 1; a flag is one "
                "bool per step",
                hint="return it as a bool array (e.g. values > 0.5)",
            )
        arr = arr != 0
    return arr


def normalize(out: Any, chunk_in: Mapping[str, np.ndarray], where: str) -> dict[str, np.ndarray]:
    """The function's return value as ``TED key -> array``, flags filled in, derived keys gone.

    Args:
        out: What the function returned.
        chunk_in: The input chunk it was given (flags are carried over from it).
        where: ``"function F, chunk I (steps a-b)"``, for messages.
    """
    if not isinstance(out, Mapping):
        raise OutputSchemaError(
            f"{where} returned {type(out).__name__}, expected a mapping of TED keys to arrays"
        )
    try:
        flat = _flatten(out)
        clash = group_clash(flat)
        if clash is not None:  # a file cannot be a folder too (zarr failed, memmap lost one)
            raise OutputSchemaError(f"output key {clash[0]!r} is both an array and a group ({clash[1]!r})")
        arrays = {k: _as_array(k, v) for k, v in flat.items()}
    except OutputSchemaError as exc:  # named with the function and the chunk, as every other
        raise OutputSchemaError(f"{where}: {exc.message}", exc.hint) from None
    rows = {k: a.shape[0] for k, a in arrays.items()}
    if len(set(rows.values())) > 1:
        raise OutputSchemaError(f"{where} returned keys with different row counts: {rows}")
    n = next(iter(rows.values())) if rows else 0
    n_in = len(chunk_in["index"])
    for flag in _FLAGS:
        if flag not in arrays and n == n_in:
            arrays[flag] = np.asarray(chunk_in[flag]).reshape(n, 1)
    if "next/done" in arrays and "next/terminated" in arrays and "next/truncated" in arrays:
        done = arrays["next/terminated"] | arrays["next/truncated"]
        if arrays["next/done"].size != done.size:
            raise OutputSchemaError(
                f"{where}: returned next/done of shape {arrays['next/done'].shape}: it is one flag per "
                "step, (steps,) or (steps, 1)"
            )
        if not np.array_equal(arrays["next/done"].reshape(done.shape) != 0, done):
            raise OutputSchemaError(
                f"{where}: returned next/done differs from next/terminated | next/truncated"
            )
    for key in DERIVED:
        arrays.pop(key, None)
    missing = [k for k in REQUIRED if k not in arrays]
    if missing:
        raise OutputSchemaError(f"{where} returned no {', '.join(missing)} (returned {sorted(arrays)})")
    if not flat_keys(arrays):
        raise OutputSchemaError(
            f"{where} returned no observation-like key (a key K together with next/K, e.g. observation)"
        )
    return arrays


def flat_keys(arrays: Mapping[str, Any]) -> list[str]:
    """Keys stored flat: ``K`` not under ``next/`` whose ``next/K`` is present too."""
    return sorted(k for k in arrays if not k.startswith("next/") and f"next/{k}" in arrays)


def infer(arrays: Mapping[str, np.ndarray], where: str) -> Schema:
    """The stored fields of a normalized output chunk (``where``: the function and chunk, which
    an error names)."""
    flat = set(flat_keys(arrays))
    schema: Schema = {}
    for key in sorted(arrays):
        if key.startswith("next/") and key[5:] in flat:
            if (
                arrays[key].shape[1:] != arrays[key[5:]].shape[1:]
                or arrays[key].dtype != arrays[key[5:]].dtype
            ):
                this, that = arrays[key], arrays[key[5:]]
                raise OutputSchemaError(
                    f"{where}: {key!r} has shape {this.shape[1:]} {this.dtype} but {key[5:]!r} has "
                    f"{that.shape[1:]} {that.dtype}; they must match"
                )
            continue
        arr = arrays[key]
        schema[key] = FieldSpec(
            key, tuple(arr.shape[1:]), dtype_name(arr.dtype), "flat" if key in flat else "step"
        )
    return schema


def check_same(schema: Schema, expected: Schema, where: str) -> None:
    """Raise when a chunk's schema differs from the first chunk's."""
    if set(schema) != set(expected):
        extra, gone = sorted(set(schema) - set(expected)), sorted(set(expected) - set(schema))
        raise OutputSchemaError(
            f"{where} returned different keys than the first chunk (new: {extra}, missing: {gone})",
            hint="the function must return the same keys, shapes and dtypes for every chunk",
        )
    for key, spec in schema.items():
        want = expected[key]
        if spec != want:
            raise OutputSchemaError(
                f"{where}: key {key!r} has shape {spec.shape} {spec.dtype} ({spec.storage}), "
                f"the first chunk had {want.shape} {want.dtype} ({want.storage})",
                hint="the function must return the same keys, shapes and dtypes for every chunk "
                "(cast with .astype(...))",
            )


def _rows_as_ints(arr: np.ndarray) -> np.ndarray:
    """Each row as integers of the same bytes, so equality is exact (NaN == NaN, -0.0 != 0.0)."""
    data = np.ascontiguousarray(arr).reshape(arr.shape[0], int(np.prod(arr.shape[1:], dtype=np.int64)))
    size = data.dtype.itemsize
    view = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(size)
    return data.view(view) if view else data.view(np.uint8)


def segments(n: int, ends: np.ndarray) -> list[tuple[int, int, bool]]:
    """``(start, stop, closed)`` runs of steps of one episode each; ``closed`` when the run
    ends its episode (the last run of a chunk may continue in the next chunk)."""
    bounds = [0, *(int(e) + 1 for e in ends)]
    runs = [(bounds[j], bounds[j + 1], True) for j in range(len(bounds) - 1)]
    if bounds[-1] < n:
        runs.append((bounds[-1], n, False))
    return runs


def check_flat(key: str, arrays: Mapping[str, np.ndarray], ends: np.ndarray, where: str, first: int) -> None:
    """``next/K[t] == K[t + 1]`` wherever step ``t`` is not the last of its episode (bitwise:
    NaN equals NaN, -0.0 differs from 0.0), one contiguous comparison per episode run."""
    cur, nxt = _rows_as_ints(arrays[key]), _rows_as_ints(arrays[f"next/{key}"])
    for a, b, _ in segments(cur.shape[0], ends):
        if b - a > 1 and not np.array_equal(nxt[a : b - 1], cur[a + 1 : b]):
            t = a + int(np.flatnonzero(np.any(nxt[a : b - 1] != cur[a + 1 : b], axis=1))[0])
            raise OutputSchemaError(
                f"{where}: next/{key} at step {first + t} differs from {key} at step {first + t + 1} "
                "inside one episode, so they cannot be stored once (flat)",
                hint=f"return the same transform for {key} and next/{key}, or store it under another name "
                f"without its next/ twin",
            )


def write_flat(
    dest: np.ndarray, row0: int, key: str, arrays: Mapping[str, np.ndarray], ends: np.ndarray
) -> int:
    """Write the flat rows of ``key`` into ``dest`` from row ``row0``: every step's value, and
    after each episode end its final ``next/K``. One slice copy per episode run, no temporary.

    Returns:
        Rows written.
    """
    cur, nxt = arrays[key], arrays[f"next/{key}"]
    row = row0
    for a, b, closed in segments(cur.shape[0], ends):
        dest[row : row + b - a] = cur[a:b]
        row += b - a
        if closed:
            dest[row] = nxt[b - 1]
            row += 1
    return row - row0


def to_flat(key: str, arrays: Mapping[str, np.ndarray], ends: np.ndarray) -> np.ndarray:
    """Flat rows of ``key`` as a new array (see :func:`write_flat`)."""
    cur = arrays[key]
    out = np.empty((cur.shape[0] + len(ends), *cur.shape[1:]), cur.dtype)
    write_flat(out, 0, key, arrays, ends)
    return out


def row_bytes(arr: np.ndarray) -> bytes:
    """One row's exact bytes (for the check across chunk boundaries)."""
    return np.ascontiguousarray(arr).tobytes()


def schema_to_json(schema: Schema) -> dict[str, Any]:
    return {k: spec.to_dict() for k, spec in schema.items()}


def schema_from_json(data: Mapping[str, Any]) -> Schema:
    return {k: FieldSpec.from_dict(k, v) for k, v in data.items()}
