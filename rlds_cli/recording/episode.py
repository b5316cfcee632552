"""One episode of a gymnasium environment, assembled step by step into TED columns, and the
environment's spaces as TED keys.

:class:`EpisodeAssembler` is the buffer behind :class:`~rlds_cli.recording.recorder.RecordEpisodes`
and :func:`~rlds_cli.recording.recorder.record`. A step costs a few list appends (one per leaf of
the spaces and per selected info key); the arrays are built once, when the episode ends. The episode
is the mapping :meth:`Dataset.episode` returns for the same data, so it goes to
``DatasetWriter.add_episode`` unchanged:

* ``observation...`` / ``next/observation...``: the observation before and after each step (the
  reset observation first, the final observation last: nothing is dropped or made up);
* ``action...``, ``next/reward`` ``(T, 1)``, ``next/terminated`` / ``next/truncated`` /
  ``next/done`` ``(T, 1)`` bool;
* ``reset_seed`` (``uint64``) and ``reset_seed_present`` (bool): the episode's reset seed, on every
  step (a growing dataset stores no per-episode arrays); ``ds.episodes["seed"]`` and
  ``["seed_present"]``, and :func:`episode_seeds`, read one per episode. Without a seed:
  ``reset_seed`` 0 and ``reset_seed_present`` false, as a converted Minari dataset's
  ``minari/episode_seed`` and ``minari/episode_seed_present``.
* ``info/<k>`` for the selected info keys. A key the reset info and every step's info hold is
  observation-like (``info/<k>`` at t, ``next/info/<k>`` at t + 1, as Minari records infos); a key
  only the steps return is a per-step value (``info/<k>``, the info ``step()`` returned).

Rewards keep the dtype numpy gives the list of rewards (``float64`` for Python floats, as Minari
stores them); integer rewards become ``float64``.

Gymnasium spaces -> TED keys, with the key mapping rlds's Minari reader uses.

A recorded observation or action is split into leaves exactly as ``formats/minari/layout.py`` splits
a Minari dataset, so data recorded by rlds and data recorded by Minari's ``DataCollector`` then
converted have the same keys, shapes, dtypes and values:

* a Dict space becomes ``<role>/<key>`` (nested Dicts nest further), a Tuple space ``<role>/0``,
  ``<role>/1``...; any other space is the leaf ``<role>`` itself;
* names are cleaned into TED keys by the same cleaner (``formats/base.py``);
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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rlds_cli.cache.episode_table import SEED_KEY, SEED_PRESENT_KEY
from rlds_cli.errors import RecordingError
from rlds_cli.formats.base import clean_keys

if TYPE_CHECKING:
    from rlds_cli.cache.dataset import Dataset


#: ``info_keys="all"``: every info key the environment returns (Minari's ``record_infos=True``).
ALL_INFOS = "all"


class EpisodeAssembler:
    """Collects the steps of one episode at a time and returns them as TED columns.

    Args:
        observation_space: The environment's observation space (any gymnasium space rlds
            stores: Box, Discrete, MultiDiscrete, MultiBinary, Text, and Dict/Tuple of them).
        action_space: Its action space.
        info_keys: Which ``info`` entries to keep: ``None`` (none), ``"all"`` (every entry of
            the first step's info with a numeric value) or a list of names (nested dicts are
            stored as ``info/<name>/<key>``).
    """

    def __init__(
        self, observation_space: Any, action_space: Any, info_keys: Sequence[str] | str | None = None
    ) -> None:
        self.observation_space = observation_space
        self.action_space = action_space
        self.obs_leaves = space_leaves(observation_space, "observation")
        self.action_leaves = space_leaves(action_space, "action")
        self._obs_get = [getter(leaf) for leaf in self.obs_leaves]
        self._act_get = [getter(leaf) for leaf in self.action_leaves]
        if isinstance(info_keys, str) and info_keys != ALL_INFOS:
            raise RecordingError(
                f"info_keys={info_keys!r}: pass a list of names, 'all' or None",
                hint="e.g. info_keys=['success'] keeps info['success'] as info/success",
            )
        self.info_keys: Sequence[str] | str | None = info_keys
        #: info entries left out with ``info_keys="all"`` because they are not numeric.
        self.skipped_info: list[str] = []
        # fixed by the first episode: (name path, TED key) of each kept info value
        self._info_plan: list[tuple[tuple[Any, ...], str]] | None = None
        # fixed by the first episode too: the kept info keys its reset info held (stored like an
        # observation, at t and t + 1); the others are stored per step
        self._reset_keys: set[str] | None = None
        self._reset_info: Mapping[str, Any] = {}
        self.active = False
        self.ended = False
        self.episodes = 0
        self.seed: int | None = None
        self._reward_dtype: np.dtype[Any] | None = None
        self._clear()

    # ------------------------------------------------------------------ steps

    def _clear(self) -> None:
        self._obs: list[list[Any]] = [[] for _ in self.obs_leaves]
        self._act: list[list[Any]] = [[] for _ in self.action_leaves]
        self._rewards: list[Any] = []
        self._terminated: list[bool] = []
        self._truncated: list[bool] = []
        self._infos: dict[str, list[Any]] = {}

    def start(self, observation: Any, info: Mapping[str, Any], seed: int | None) -> None:
        """Begin an episode at its reset observation (an unfinished one is discarded: call
        :meth:`finish` first to keep it)."""
        self._clear()
        if seed is not None and not 0 <= seed < 2**64:
            raise RecordingError(
                f"reset seed {seed} does not fit the 64 bits a recording keeps",
                hint="seed the environment with a number from 0 to 2**64 - 1",
            )
        try:
            for get, values in zip(self._obs_get, self._obs, strict=True):
                values.append(_own(get(observation)))
        except (KeyError, IndexError, TypeError):
            self._clear()
            error = _missing_leaf(self._obs_get, self.obs_leaves, observation)
            if error is None:
                raise
            raise error from None
        self._reset_info = info
        if self.info_keys is not None and self._info_plan is not None:
            self._reset_infos()
        self.seed = seed
        self.active = True
        self.ended = False

    def _reset_infos(self) -> None:
        held = set()
        for path, key in self._info_plan or ():
            if self._reset_keys is not None and key not in self._reset_keys:
                continue  # stored per step: the first episode's reset info did not hold it
            found, value = _lookup(self._reset_info, path)
            if found:
                self._infos[key] = [_own(value)]
                held.add(key)
            elif self._reset_keys is not None:
                self._clear()
                raise RecordingError(
                    f"info {'/'.join(map(str, path))!r} is missing from the reset info of episode "
                    f"{self.episodes}; the first episode's held it, so it is stored like an observation",
                    hint="return it from reset() in every episode, or leave it out of info_keys",
                )
        if self._reset_keys is None:
            self._reset_keys = held

    def step(
        self,
        action: Any,
        observation: Any,
        reward: Any,
        terminated: Any,
        truncated: Any,
        info: Mapping[str, Any],
    ) -> None:
        """Add one transition (what ``env.step(action)`` returned for ``action``).

        Raises:
            RecordingError: the reward is not one number, or ``terminated``/``truncated`` not
                one bool (checked before the step is added: the episode is as it was).
        """
        if not self.active:
            raise RecordingError(
                "step() after the episode ended; call reset() first"
                if self.ended
                else "step() before reset(): the recording has no episode to add the step to",
                hint="reset the environment at the start of every episode",
            )
        t = len(self._rewards)
        reward = _scalar_reward(reward, t, self.episodes)
        terminated = _flag("terminated", terminated, t, self.episodes)
        truncated = _flag("truncated", truncated, t, self.episodes)
        try:  # the plain loops of every step; the rare miss is undone and named below
            for get, values in zip(self._act_get, self._act, strict=True):
                values.append(_own(get(action)))
            for get, values in zip(self._obs_get, self._obs, strict=True):
                values.append(_own(get(observation)))
        except (KeyError, IndexError, TypeError):
            t = len(self._rewards)  # the episode as it was before this step
            for values in self._act:
                del values[t:]
            for values in self._obs:
                del values[t + 1 :]
            error = _missing_leaf(self._act_get, self.action_leaves, action) or _missing_leaf(
                self._obs_get, self.obs_leaves, observation
            )
            if error is None:
                raise
            raise error from None
        self._rewards.append(reward)
        self._terminated.append(terminated)
        self._truncated.append(truncated)
        if self.info_keys is not None:
            if self._info_plan is None:  # the first step's info names the keys, once
                self._plan_infos(info)
                self._reset_infos()
            self._step_infos(info)
        if terminated or truncated:
            self.active = False
            self.ended = True

    def _step_infos(self, info: Mapping[str, Any]) -> None:
        for path, key in self._info_plan or ():
            found, value = _lookup(info, path)
            if not found:
                raise RecordingError(
                    f"info {'/'.join(path)!r} is missing at step {len(self._rewards) - 1} of episode "
                    f"{self.episodes} (it was recorded before)",
                    hint="pick info_keys that every step returns",
                )
            self._infos.setdefault(key, []).append(_own(value))

    def _plan_infos(self, info: Mapping[str, Any]) -> None:
        """Fix which info values are kept, from the first step's info."""
        if self.info_keys == ALL_INFOS:
            names = list(info)
        else:
            assert not isinstance(self.info_keys, str) and self.info_keys is not None
            names = list(self.info_keys)
            missing = [n for n in names if n not in info]
            if missing:
                raise RecordingError(
                    f"info {missing[0]!r} is not in the info step() returned (it has "
                    f"{sorted(map(str, info))[:8]})",
                    hint="pick info_keys from what the environment's info holds",
                )
        wanted: dict[str, tuple[str, ...]] = {}  # label -> the key parts as text
        found: dict[str, tuple[Any, ...]] = {}  # label -> the keys to look the value up by
        for name in names:
            for path in _info_paths(info[name], (name,)):
                _, value = _lookup(info, path)
                label = "/".join(map(str, path))
                if self.info_keys == ALL_INFOS and not _numeric(value):
                    self.skipped_info.append(label)
                    continue
                if label in wanted:  # one would overwrite the other's column
                    raise RecordingError(
                        f"info values {value_path('info', wanted[label][1:])} and "
                        f"{value_path('info', path)} both flatten to {label!r}; one would overwrite "
                        "the other",
                        hint="leave one of them out of info_keys, or rename the key that holds '/'",
                    )
                wanted[label] = ("info", *map(str, path))
                found[label] = path
        cleaned = clean_keys(wanted) if wanted else {}
        self._info_plan = [(found[label], cleaned[label]) for label in wanted]

    # ------------------------------------------------------------------ the episode

    @property
    def length(self) -> int:
        """Steps of the current episode so far."""
        return len(self._rewards)

    def finish(self) -> dict[str, np.ndarray] | None:
        """The current episode as TED columns (``None`` when it has no step), and clear it.

        An episode that did not end (the user reset or closed the environment, or ``record``
        reached its step budget) is kept with its last step marked truncated, as Minari's
        ``DataCollector`` keeps it.
        """
        self.active = False
        if not self._rewards:
            self._clear()
            return None
        if not (self._terminated[-1] or self._truncated[-1]):
            self._truncated[-1] = True
        t = len(self._rewards)
        ep: dict[str, np.ndarray] = {}
        for leaf, values in zip(self.obs_leaves, self._obs, strict=True):
            arr = stack_leaf(leaf, values, leaf.key)
            ep[leaf.key], ep[f"next/{leaf.key}"] = arr[:-1], arr[1:]
        for leaf, values in zip(self.action_leaves, self._act, strict=True):
            ep[leaf.key] = stack_leaf(leaf, values, leaf.key)
        rewards = np.asarray(self._rewards)
        if rewards.dtype.kind != "f":
            rewards = rewards.astype(np.float64)
        # the first episode's reward dtype is the dataset's: an environment whose rewards are
        # np.float32 in one episode and Python numbers (float64) in the next records on
        self._reward_dtype = self._reward_dtype or rewards.dtype
        rewards = rewards.astype(self._reward_dtype, copy=False)
        ep["next/reward"] = rewards.reshape(t, 1)
        terminated = np.asarray(self._terminated, bool).reshape(t, 1)
        truncated = np.asarray(self._truncated, bool).reshape(t, 1)
        ep["next/terminated"], ep["next/truncated"] = terminated, truncated
        ep["next/done"] = terminated | truncated
        ep[SEED_KEY] = np.full(t, 0 if self.seed is None else self.seed, np.uint64)
        ep[SEED_PRESENT_KEY] = np.full(t, self.seed is not None, bool)
        for key, values in self._infos.items():
            arr = _stack_info(values, key)
            if len(values) == t + 1:
                ep[key], ep[f"next/{key}"] = arr[:-1], arr[1:]
            else:
                ep[key] = arr
        self.episodes += 1
        self._clear()
        return ep


def _scalar_reward(reward: Any, t: int, episode: int) -> Any:
    """``reward`` if it is one number (a Python number, or a numpy scalar or one-element array, then
    as a numpy scalar of its dtype); else the error naming it (a vector reward would stack into
    ``(T, k)``)."""
    if type(reward) is float or type(reward) is int:  # the usual case, without numpy
        return reward
    try:
        arr = np.asarray(reward)
    except (TypeError, ValueError):
        arr = np.asarray(None)  # object: refused below
    if arr.dtype.kind not in "biuf" or arr.size != 1:
        raise RecordingError(
            f"next/reward: step {t} of episode {episode} returned {_shown(reward, arr)} as its reward; "
            "a recording keeps one number (a scalar) a step",
            hint="return the reward as one float; to keep several, put them in info and pass info_keys",
        )
    return arr.reshape(())[()]


def _flag(name: str, value: Any, t: int, episode: int) -> bool:
    """``value`` as a bool if it is one (a bool, numpy bool, or a number 0 or 1, also as a
    one-element array); else the error naming it (``bool()`` would raise on an array and take any
    other number as True)."""
    if type(value) is bool:
        return value
    if type(value) is np.bool_:
        return bool(value)
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError):
        arr = np.asarray(None)
    if arr.size == 1 and (arr.dtype.kind == "b" or (arr.dtype.kind in "iuf" and arr.reshape(()) in (0, 1))):
        return bool(arr.reshape(()))
    raise RecordingError(
        f"next/{name}: step {t} of episode {episode} returned {_shown(value, arr)} as {name}; "
        "a recording keeps one bool (a scalar) a step",
        hint=f"return {name} as one bool (a vectorized environment: record each one unvectorized)",
    )


def _shown(value: Any, arr: np.ndarray) -> str:
    """A value in an error: its repr (cut short) and, for an array, its shape and dtype."""
    text = repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    if isinstance(value, np.ndarray) or hasattr(value, "shape"):
        return f"{text} (shape {tuple(arr.shape)}, {arr.dtype})"
    return text


def _missing_leaf(gets: list[Any], leaves: list[Leaf], value: Any) -> RecordingError | None:
    """The error naming the first leaf that ``value`` (an observation or action) lacks, ``None``
    when it has every one."""
    for get, leaf in zip(gets, leaves, strict=True):
        try:
            get(value)
        except (KeyError, IndexError, TypeError) as exc:
            return RecordingError(
                f"{leaf.key}: the value given ({type(value).__name__}) has no part "
                f"{'/'.join(map(str, leaf.path))!r} ({type(exc).__name__}: {exc})",
                hint="the environment returned values outside its declared space",
            )
    return None


def _info_paths(value: Any, path: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """The leaves of an info value: nested dicts are walked (their keys as they are: an int key
    stays an int), anything else is a leaf."""
    if isinstance(value, Mapping):
        return [p for k, v in value.items() for p in _info_paths(v, (*path, k))]
    return [path]


def _lookup(info: Mapping[Any, Any], path: tuple[Any, ...]) -> tuple[bool, Any]:
    value: Any = info
    for part in path:
        if not isinstance(value, Mapping) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _own(value: Any) -> Any:
    """``value`` as kept until the episode is stacked: an array copied (an environment or a
    policy may refill one buffer in place at every step, e.g. a simulator's state)."""
    return value.copy() if isinstance(value, np.ndarray) else value


def _numeric(value: Any) -> bool:
    try:
        return np.asarray(value).dtype.kind in "biuf"
    except ValueError:  # ragged nested lists: not numbers of one shape
        return False


def _stack_info(values: list[Any], key: str) -> np.ndarray:
    try:
        arr = np.asarray(values)
    except ValueError:
        arr = np.asarray(values, dtype=object)
    if arr.dtype.kind not in "biuf":
        raise RecordingError(
            f"{key}: the values are not numbers of one shape (got {arr.dtype}); rlds stores numeric "
            "arrays only",
            hint="leave this key out of info_keys, or return numbers of a fixed shape",
        )
    return arr


def episode_seeds(dataset: Dataset) -> list[int | None]:
    """The reset seed of every episode of a dataset (``None`` where it had none, or where the
    dataset records no seeds): ``dataset.episodes["seed"]`` as Python values."""
    table = dataset.episodes
    if table.seeds is None or table.seed_present is None:
        return [None] * len(table)
    return [int(s) if p else None for s, p in zip(table.seeds, table.seed_present, strict=True)]


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
        with np.errstate(over="ignore"):  # a finite value the float dtype cannot hold: refused below
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
    if leaf.dtype.kind == "f" and values and not np.isfinite(arr).all():
        _require_finite_kept(arr, values, leaf, key)
    return arr


def _require_finite_kept(arr: np.ndarray, values: list[Any], leaf: Leaf, key: str) -> None:
    """Refuse finite values the leaf's float dtype turns into infinities (1e40 in a float32
    Box): rounding is a float dtype's way, an infinity is another number."""
    given = np.asarray(values)
    if given.dtype.kind != "f" or given.shape != arr.shape:
        return
    lost = (np.isfinite(given) & ~np.isfinite(arr)).reshape(len(arr), -1).any(axis=1)
    if lost.any():
        row = int(np.flatnonzero(lost)[0])
        raise RecordingError(
            f"{key}: row {row} holds a finite value the {leaf.kind} space's {leaf.dtype} cannot hold "
            f"(largest {float(np.max(np.abs(given[row][np.isfinite(given[row])]))):.3g}): it would be "
            "stored as an infinity",
            hint="the environment returned values outside its declared space",
        )


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
