"""What a writer accepts: a batch of TED columns (numpy, torch, a TensorDict, nested or ``/``-joined
keys) turned into the stored columns of whole episodes, or one clear error.

:func:`flatten` gives every leaf a ``/``-joined key as a numpy array; :func:`split` cuts a run of
steps at its episode ends; :func:`episode_columns` checks one whole episode against the TED rules
and returns what the cache stores: step keys (``N`` rows) and observation-like keys (``N + 1`` rows:
every observation and the final one). Every check names the key at fault and raises
:class:`~rlds_cli.errors.EpisodeFormatError` before anything is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlds_cli._util.rows import rows_equal
from rlds_cli.cache import ted
from rlds_cli.cache.manifest import FieldSpec
from rlds_cli.cache.ted import BATCH_KEYS, NUMBERS_HINT, as_numbers, group_clash, is_numeric, key_problem
from rlds_cli.errors import EpisodeFormatError, SchemaMismatchError

#: Read-time keys a batch may carry (``Dataset.episode`` returns them): checked, not stored.
DERIVED = ("episode", "next/done")
#: TorchRL's flags at time t (the previous step's ``next/`` flags) and collector bookkeeping:
#: a collector rollout carries them; TED stores only the ``next/`` flags.
TORCHRL_EXTRAS = ("done", "terminated", "truncated")
FLAGS = ("next/terminated", "next/truncated")
REWARD = "next/reward"


def _to_numpy(value: Any, key: str) -> np.ndarray:
    arr, problem = as_numbers(value)
    if arr is None:
        raise EpisodeFormatError(f"key {key!r}: {problem}", hint=NUMBERS_HINT)
    return arr


def flatten(batch: Any, what: str = "episode") -> dict[str, np.ndarray]:
    """Every leaf of ``batch`` (a mapping with ``/``-joined or tuple keys, nested mappings, or a
    TensorDict) as a numpy array under its ``/``-joined key.

    Two leaves that join to the same key (``{"a/b": x, "a": {"b": y}}``) are refused, naming where
    each was given.
    """
    out: dict[str, np.ndarray] = {}

    def put(key: str, value: Any) -> None:
        if not key or any(not part for part in key.split("/")):
            raise EpisodeFormatError(f"{what}: empty key part in {key!r}")
        problem = key_problem(key)  # a key names files and folders of the dataset
        if problem is not None:
            raise EpisodeFormatError(
                f"{what}: key {key!r} cannot be stored: {problem}",
                hint="keys are '/'-separated parts of A-Z a-z 0-9 _ . -",
            )
        if key in BATCH_KEYS:
            raise EpisodeFormatError(
                f"{what}: key {key!r} is a name every batch gives itself (each row's step): the "
                "stored values would be hidden",
                hint=f"store it under another name, e.g. 'info/{key}'",
            )
        if key in out:
            places = " and ".join(f"{what}{where}" for where in _given_at(batch, key))
            raise EpisodeFormatError(
                f"{what}: key {key!r} is given twice ({places}); one would overwrite the other",
                hint="give each array once, under one key",
            )
        out[key] = _to_numpy(value, key)

    def walk(prefix: str, node: Any) -> None:
        if type(node).__module__.startswith("tensordict"):
            for k, v in node.items(include_nested=True, leaves_only=True):
                put(prefix + ("/".join(k) if isinstance(k, tuple) else str(k)), v)
            return
        if isinstance(node, Mapping):
            for k, v in node.items():
                name = "/".join(k) if isinstance(k, tuple) else str(k)
                if isinstance(v, Mapping) or type(v).__module__.startswith("tensordict"):
                    walk(f"{prefix}{name}/", v)
                else:
                    put(prefix + name, v)
            return
        raise EpisodeFormatError(f"{what} is a {type(node).__name__}, not a mapping of TED keys")

    walk("", batch)
    clash = group_clash(out)
    if clash is not None:
        raise EpisodeFormatError(f"{what}: key {clash[0]!r} is both an array and a group ({clash[1]!r})")
    return out


def _given_at(batch: Any, key: str) -> list[str]:
    """Where in ``batch`` the leaves that :func:`flatten` joins to ``key`` are, as Python indexing
    (``['observation']['a/b']``, ``[('next', 'reward')]``); walked only for the error, so a good
    batch pays nothing."""
    found: list[str] = []

    def walk(prefix: str, node: Any, where: str) -> None:
        if type(node).__module__.startswith("tensordict"):
            for k in node.keys(include_nested=True, leaves_only=True):
                if prefix + ("/".join(k) if isinstance(k, tuple) else str(k)) == key:
                    found.append(f"{where}[{k!r}]")
        elif isinstance(node, Mapping):
            for k, v in node.items():
                name = prefix + ("/".join(k) if isinstance(k, tuple) else str(k))
                if isinstance(v, Mapping) or type(v).__module__.startswith("tensordict"):
                    walk(f"{name}/", v, f"{where}[{k!r}]")
                elif name == key:
                    found.append(f"{where}[{k!r}]")

    walk("", batch, "")
    return found


def _flags(cols: dict[str, np.ndarray], n: int, what: str) -> tuple[np.ndarray, np.ndarray]:
    out = []
    for key in FLAGS:
        if key not in cols:
            raise EpisodeFormatError(f"{what}: missing key {key!r}")
        v = cols[key]
        if v.dtype != np.bool_:
            raise EpisodeFormatError(f"{what}: {key!r} must be bool, got {v.dtype}")
        if v.shape not in ((n,), (n, 1)):
            raise EpisodeFormatError(f"{what}: {key!r} has shape {v.shape}, expected ({n},) or ({n}, 1)")
        out.append(v.reshape(n))
    return out[0], out[1]


def length(cols: dict[str, np.ndarray], what: str) -> int:
    """The number of steps of ``cols`` (the rows of ``action``), checked on every key."""
    ref = "action" if "action" in cols else next((k for k in cols if k.startswith("action/")), None)
    if ref is None:
        raise EpisodeFormatError(f"{what}: missing key 'action'")
    if cols[ref].ndim == 0:
        raise EpisodeFormatError(f"{what}: {ref!r} is a scalar, expected one row per step")
    n = int(cols[ref].shape[0])
    if (problem := ted.rows_problem(cols, n)) is not None:
        rows = "a scalar" if problem.rows is None else f"{problem.rows} rows"
        raise EpisodeFormatError(f"{what}: key {problem.key!r} has {rows}, {ref!r} has {n}")
    return n


def drop_extras(cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``cols`` without TorchRL's root flags and ``collector/`` keys."""
    return {k: v for k, v in cols.items() if k not in TORCHRL_EXTRAS and not k.startswith("collector/")}


def split(cols: dict[str, np.ndarray], what: str) -> tuple[list[int], int]:
    """Where the episodes of a run of steps end: ``(ends, n)``, ``ends`` the positions of the steps
    with ``terminated | truncated`` (steps after the last end belong to an episode still open)."""
    n = length(cols, what)
    term, trunc = _flags(cols, n, what)
    return [int(i) for i in np.flatnonzero(term | trunc)], n


@dataclass
class EpisodeColumns:
    """One whole episode as the cache stores it: ``steps`` (``N`` rows each) and ``flat``
    (observation-like keys, ``N + 1`` rows: each step's observation, then the final one).

    A flat column is kept as its two pieces, ``(observation, next/observation[-1:])``, written one
    after the other: joining them would copy every frame once more (a page fault per 4 KiB).
    """

    steps: dict[str, np.ndarray]
    flat: dict[str, tuple[np.ndarray, np.ndarray]]
    num_steps: int

    def fields(self) -> dict[str, FieldSpec]:
        from rlds_cli.cache.builder import dtype_name

        out = {
            k: FieldSpec(k, tuple(v.shape[1:]), dtype_name(v.dtype), "step") for k, v in self.steps.items()
        }
        out.update(
            {
                k: FieldSpec(k, tuple(v.shape[1:]), dtype_name(v.dtype), "flat")
                for k, (v, _) in self.flat.items()
            }
        )
        return dict(sorted(out.items()))

    def pieces(self, key: str) -> tuple[np.ndarray, ...]:
        """The rows of stored column ``key``, in order, as the pieces to write."""
        return self.flat[key] if key in self.flat else (self.steps[key],)

    def nbytes(self) -> int:
        """The bytes of its stored columns."""
        return sum(int(v.nbytes) for v in self.steps.values()) + sum(
            int(a.nbytes) + int(b.nbytes) for a, b in self.flat.values()
        )

    def owned(self) -> EpisodeColumns:
        """A copy sharing no memory with the caller's arrays (an episode kept for a later commit
        must not change when the caller reuses its buffers)."""
        return EpisodeColumns(
            {k: v.copy() for k, v in self.steps.items()},
            {k: (a.copy(), b.copy()) for k, (a, b) in self.flat.items()},
            self.num_steps,
        )


def episode_columns(cols: dict[str, np.ndarray], what: str = "episode") -> EpisodeColumns:
    """Check one whole episode (flattened TED columns, its last step the only one with
    ``terminated | truncated``) and return its stored columns."""
    cols = drop_extras(cols)
    n = length(cols, what)
    if n == 0:
        raise EpisodeFormatError(f"{what} has no steps")
    empty = next((k for k, v in cols.items() if v.ndim > 1 and 0 in v.shape[1:]), None)
    if empty is not None:  # stored as (0, 0): a segment that reads back as damaged
        raise EpisodeFormatError(
            f"{what}: {empty!r} has rows of shape {cols[empty].shape[1:]}, which hold no value",
            hint="leave the key out (conversions drop such keys too); nothing of this episode was written",
        )
    term, trunc = _flags(cols, n, what)
    done = term | trunc
    problem = ted.episode_done_problem(done)
    if problem is not None and problem.kind == ted.END_NOT_DONE:
        raise EpisodeFormatError(
            f"{what}: its last step has neither 'next/terminated' nor 'next/truncated' set",
            hint="an episode ends with terminated=True or truncated=True on its last step",
        )
    if problem is not None:
        raise EpisodeFormatError(
            f"{what}: step {problem.step} of {n} is marked terminated/truncated but the episode goes on",
            hint="pass one episode at a time to add_episode, or use extend() for several",
        )
    if "next/done" in cols:
        given = cols["next/done"]
        if (
            given.dtype != np.bool_
            or given.reshape(-1).shape != (n,)
            or not np.array_equal(given.reshape(n), done)
        ):
            raise EpisodeFormatError(
                f"{what}: 'next/done' is not bool or differs from terminated | truncated"
            )
    if REWARD not in cols:
        raise EpisodeFormatError(f"{what}: missing key {REWARD!r}")
    reward = cols[REWARD]
    if reward.dtype.kind not in "fiu" or reward.shape not in ((n,), (n, 1)):
        raise EpisodeFormatError(
            f"{what}: {REWARD!r} has shape {reward.shape} {reward.dtype}, expected ({n}, 1) numbers"
        )
    steps: dict[str, np.ndarray] = {REWARD: reward.reshape(n, 1)}
    steps.update({k: cols[k].reshape(n, 1) for k in FLAGS})
    flat: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    roots = [k for k in cols if not k.startswith("next/") and k not in DERIVED]
    for key in roots:
        if f"next/{key}" in cols:
            now, after = cols[key], cols[f"next/{key}"]
            if now.shape != after.shape or now.dtype != after.dtype:
                raise EpisodeFormatError(
                    f"{what}: 'next/{key}' is {after.shape} {after.dtype}, {key!r} is {now.shape} {now.dtype}"
                )
            same = rows_equal(after[:-1], now[1:])
            if not same.all():
                t = int(np.flatnonzero(~same)[0])
                raise EpisodeFormatError(
                    f"{what}: 'next/{key}'[{t}] differs from {key!r}[{t + 1}] inside the episode",
                    hint="inside an episode next/observation[t] must equal observation[t+1]",
                )
            flat[key] = (now, after[-1:])
        elif key == "observation" or key.startswith("observation/"):
            raise EpisodeFormatError(
                f"{what}: {key!r} has no 'next/{key}' (the final observation is missing)",
                hint="pass next/observation too: its last row is the episode's final observation",
            )
        else:
            steps[key] = cols[key]
    if not flat:
        raise EpisodeFormatError(f"{what}: no observation (a key with its next/ key, e.g. 'observation')")
    for key in cols:
        if key.startswith("next/") and key not in (REWARD, *FLAGS, "next/done") and key[5:] not in cols:
            steps[key] = cols[key]  # a per-step extra under next/ (e.g. next/info/...)
    return EpisodeColumns(steps, flat, n)


def check_schema(got: dict[str, FieldSpec], schema: dict[str, FieldSpec], name: str) -> None:
    """Raise :class:`SchemaMismatchError` naming the first key where ``got`` differs from the
    dataset ``name``'s ``schema``."""
    missing = sorted(set(schema) - set(got))
    extra = sorted(set(got) - set(schema))
    if missing or extra:
        raise SchemaMismatchError(
            f"dataset {name!r}: the episode's keys differ from the dataset's"
            + (f"; missing {missing}" if missing else "")
            + (f"; not in the dataset {extra}" if extra else "")
        )
    for key, spec in schema.items():
        g = got[key]
        if (g.shape, g.dtype, g.storage) != (spec.shape, spec.dtype, spec.storage):
            raise SchemaMismatchError(
                f"dataset {name!r}: key {key!r} is {g.shape} {g.dtype} ({g.storage}), "
                f"the dataset stores {spec.shape} {spec.dtype} ({spec.storage})"
            )


def _stored_shape(key: str, shape: tuple[int, ...], dtype: np.dtype) -> tuple[int, ...]:
    """A schema's row shape as :func:`episode_columns` stores it: the reward and the flags one
    number a row, ``(1,)`` (``()`` given is the same), the flags bool, the reward a number."""
    if key not in (REWARD, *FLAGS):
        return shape
    if shape not in ((), (1,)):
        raise EpisodeFormatError(f"schema: {key!r} is one value a step, () or (1,), not {shape}")
    if key in FLAGS and dtype != np.bool_:
        raise EpisodeFormatError(f"schema: {key!r} must be bool, not {dtype}")
    if key == REWARD and dtype.kind not in "fiu":
        raise EpisodeFormatError(f"schema: {key!r} must be a number (float or integer), not {dtype}")
    return (1,)


def schema_fields(schema: Mapping[str, Any]) -> dict[str, FieldSpec]:
    """The stored fields of a schema given as TED keys -> ``(shape, dtype)`` (what
    ``Dataset.fields`` returns): a key with its ``next/`` key is stored once (flat), the
    derived ``episode`` and ``next/done`` are not stored."""
    from rlds_cli.cache.builder import dtype_name

    keys = {"/".join(k) if isinstance(k, tuple) else str(k): v for k, v in schema.items()}
    out: dict[str, FieldSpec] = {}
    for key, value in keys.items():
        if key in DERIVED or (key.startswith("next/") and key[5:] in keys):
            continue
        problem = key_problem(key)
        if problem is not None:
            raise EpisodeFormatError(f"schema: key {key!r} cannot be stored: {problem}")
        try:
            shape, dtype = value
            shape, dtype = tuple(int(d) for d in shape), np.dtype(dtype)
        except (TypeError, ValueError):
            raise EpisodeFormatError(f"schema: key {key!r} is not (shape, dtype): {value!r}") from None
        if any(d < 0 for d in shape) or not is_numeric(dtype):
            raise EpisodeFormatError(
                f"schema: key {key!r} is {shape} {dtype}: rows of bool, integers or floats of a "
                "shape of non-negative sizes"
            )
        shape = _stored_shape(key, shape, dtype)
        out[key] = FieldSpec(key, shape, dtype_name(dtype), "flat" if f"next/{key}" in keys else "step")
    if (missing := ted.missing_step_keys(out)) is not None:
        raise EpisodeFormatError(f"schema: missing key {missing.keys[0]!r}")
    if not any(s.storage == "flat" for s in out.values()):
        raise EpisodeFormatError("schema: no observation (a key with its next/ key, e.g. 'observation')")
    return dict(sorted(out.items()))
