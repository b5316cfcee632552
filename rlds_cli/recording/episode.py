"""One episode of a gymnasium environment, assembled step by step into TED columns.

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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rlds_cli.cache.episode_table import SEED_KEY, SEED_PRESENT_KEY
from rlds_cli.errors import RecordingError
from rlds_cli.formats.keys import clean_keys
from rlds_cli.recording.spaces import Leaf, getter, space_leaves, stack_leaf, value_path

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
        self._info_plan: list[tuple[tuple[str, ...], str]] | None = None
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
                values.append(get(observation))
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
        for path, key in self._info_plan or ():
            found, value = _lookup(self._reset_info, path)
            if found:
                self._infos[key] = [value]

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
                values.append(get(action))
            for get, values in zip(self._obs_get, self._obs, strict=True):
                values.append(get(observation))
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
            self._infos.setdefault(key, []).append(value)

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
        wanted: dict[str, tuple[str, ...]] = {}
        for name in names:
            for path in _info_paths(info[name], (str(name),)):
                _, value = _lookup(info, path)
                if self.info_keys == ALL_INFOS and not _numeric(value):
                    self.skipped_info.append("/".join(path))
                    continue
                label = "/".join(path)
                if label in wanted:  # one would overwrite the other's column
                    raise RecordingError(
                        f"info values {value_path('info', wanted[label][1:])} and "
                        f"{value_path('info', path)} both flatten to {label!r}; one would overwrite "
                        "the other",
                        hint="leave one of them out of info_keys, or rename the key that holds '/'",
                    )
                wanted[label] = ("info", *path)
        cleaned = clean_keys(wanted) if wanted else {}
        self._info_plan = [(wanted[label][1:], cleaned[label]) for label in wanted]

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


def _info_paths(value: Any, path: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The leaves of an info value: nested dicts are walked, anything else is a leaf."""
    if isinstance(value, Mapping):
        return [p for k, v in value.items() for p in _info_paths(v, (*path, str(k)))]
    return [path]


def _lookup(info: Mapping[str, Any], path: tuple[str, ...]) -> tuple[bool, Any]:
    value: Any = info
    for part in path:
        if not isinstance(value, Mapping) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _numeric(value: Any) -> bool:
    return np.asarray(value).dtype.kind in "biuf"


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
