"""Sequence-model inputs: per-key temporal windows, and the previous action and reward.

**Windows** (``Loader(..., windows={key: offsets})``, LeRobot's ``delta_timestamps``). For each
sampled step ``t``, a windowed ``key`` becomes its values at steps ``t + d`` for each offset ``d``
(shape ``[..., len(offsets), *key shape]``), and ``<key>_is_pad`` (bool, ``[..., len(offsets)]``)
is True where ``t + d`` lies outside the episode. Padding follows LeRobot
(``LeRobotDataset._get_query_indices``: indices clamped to the episode's bounds): a padded entry
repeats the episode's first or last step. E.g. ``{"observation": range(-1, 1), "action":
range(0, 50)}`` gives an ACT / diffusion-policy batch: ``observation`` ``[B, 2, ...]``, ``action``
``[B, 50, A]``, ``observation_is_pad`` ``[B, 2]``, ``action_is_pad`` ``[B, 50]``.

Offsets are whole steps, or seconds (floats) for a dataset with a frame rate (its card's
``fps``: a LeRobot source's, divided by downsampling; else ``fps=``), converted once and refused
when not a whole number of frames (LeRobot's ``tolerance_s``, 1e-4 s). Keys with the same offsets
share one vectorized gather. With slices (``[S, T]`` indices) every step gets its window
(``[S, T, W, ...]``).

**Previous action and reward** (AMAGO's ``rl2s``). :class:`PrevActionReward` adds, per step
``t``, the action at ``t - 1`` and the reward after it (zeros at an episode's first step) and the
step's position in its episode, from the batch's ``index`` alone: it works with every sampler,
prefetch and exact resume (it draws nothing at random).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rlds_cli.cache.card import dataset_fps
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.reader import Episodes, stored_keys
from rlds_cli.cache.ted import TedBatch, join_key
from rlds_cli.loader.sources import HostSource

PAD_SUFFIX = "_is_pad"
TOLERANCE_S = 1e-4  # LeRobot's default tolerance_s

Offsets = Iterable[int] | Iterable[float]
#: The farthest offset, in steps: a step plus it stays within int64.
_FARTHEST = 1 << 62


def to_steps(key: str, offsets: Sequence[Any], fps: float | None) -> np.ndarray:
    """``offsets`` as int64 steps: integers as they are, seconds (floats) times ``fps``."""
    if any(isinstance(o, bool) or not isinstance(o, int | float | np.integer | np.floating) for o in offsets):
        raise ValueError(f"windows[{key!r}] must hold integer steps or float seconds; got {list(offsets)!r}")
    whole = [isinstance(o, int | np.integer) for o in offsets]
    if all(whole):
        if any(abs(int(o)) > _FARTHEST for o in offsets):  # t + offset would wrap round int64
            raise ValueError(f"windows[{key!r}]: offsets {list(offsets)!r} reach past 2**62 steps")
        return np.asarray(offsets, np.int64)
    if any(whole):
        raise ValueError(
            f"windows[{key!r}] mixes whole steps (ints) and seconds (floats): {list(offsets)!r}; "
            "give all of one kind (1 is a step, 1.0 a second)"
        )
    if fps is None:
        raise ValueError(
            f"windows[{key!r}] gives times in seconds, and the dataset records no frame rate: "
            "pass fps= (Windows(..., fps=...)) or whole steps"
        )
    frames = np.asarray(offsets, np.float64) * fps
    if not (np.abs(frames) <= _FARTHEST).all():  # NaN, inf, or a time past any episode
        shown = list(offsets)
        raise ValueError(f"windows[{key!r}]: times {shown!r} are not finite times within 2**62 frames")
    steps = np.round(frames)
    off = np.abs(frames - steps) / fps
    if (off > TOLERANCE_S).any():
        bad = [float(t) for t, o in zip(offsets, off, strict=True) if o > TOLERANCE_S]
        raise ValueError(
            f"windows[{key!r}]: times {bad} are not whole frames at {fps:g} fps "
            f"(tolerance {TOLERANCE_S} s); use multiples of 1/{fps:g} s"
        )
    return steps.astype(np.int64)


class Windows:
    """The transform behind ``Loader(..., windows=...)`` (see the module docs).

    As the first transform of a :class:`~rlds_cli.loader.Loader`, the loader never reads the
    windowed keys itself (:meth:`claim`). Bound to a dataset (:meth:`bind`) it works on any batch
    with an ``index``; bound to a :class:`~rlds_cli.loader.mixture.MixtureSource`
    (:meth:`bind_source`), on a mixture's batches (``source`` and ``index``).

    Args:
        windows: ``{key: offsets}``, offsets in steps (ints) or seconds (floats).
        fps: Frame rate for offsets in seconds (default: the one the dataset records).
    """

    needs_host = True

    def rewrites_raw(self, key: str) -> bool:
        """Whether ``key`` is written anew from the cache's (raw) values: a windowed key."""
        return key in self.offsets

    def __init__(self, windows: Mapping[str | tuple[str, ...], Offsets], fps: float | None = None) -> None:
        if not isinstance(windows, Mapping) or not windows:
            raise ValueError(f"windows must be a non-empty mapping {{key: offsets}}; got {windows!r}")
        self.offsets: dict[str, list[Any]] = {}
        for key, offs in windows.items():
            name = join_key(key)
            if isinstance(offs, str | bytes) or not isinstance(offs, Iterable):
                raise ValueError(f"windows[{name!r}] must be a sequence of offsets; got {offs!r}")
            listed = list(offs)
            if not listed:
                raise ValueError(f"windows[{name!r}] is empty; give at least one offset")
            self.offsets[name] = listed
        if fps is not None and not fps > 0:
            raise ValueError(f"fps must be > 0, got {fps!r}")
        self.fps = fps
        self.steps: dict[str, np.ndarray] = {}
        # per group of keys with the same offsets: (offsets, keys, read(steps, episode))
        self._groups: list[tuple[np.ndarray, list[str], Callable[[np.ndarray, np.ndarray], TedBatch]]] = []
        self._episodes: Episodes | None = None
        self._dataset: Dataset | None = None
        self._mixture_offsets: np.ndarray | None = None
        self._in_memory = False

    def __repr__(self) -> str:
        return f"Windows({self.offsets!r})"

    def __getstate__(self) -> dict[str, Any]:
        # the dataset travels by path, columns reopen in the worker (a mixture's parts would carry
        # their arrays: bind those in the worker instead)
        if self._mixture_offsets is not None:
            raise TypeError("Windows bound to a mixture cannot be pickled; bind it where it runs")
        state = dict(self.__dict__)
        state["_groups"], state["_episodes"] = [], None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._dataset is not None:
            self._open(in_memory=self._in_memory)

    def _convert(self, fps: float | None, known: Iterable[str], where: str) -> None:
        missing = sorted(set(self.offsets) - set(known))
        if missing:
            raise KeyError(f"windows name key(s) {missing} that {where} does not have")
        self.steps = {k: to_steps(k, v, self.fps or fps) for k, v in self.offsets.items()}

    def _grouped(self) -> dict[tuple[int, ...], list[str]]:
        groups: dict[tuple[int, ...], list[str]] = {}
        for key, steps in self.steps.items():
            groups.setdefault(tuple(steps.tolist()), []).append(key)
        return groups

    def bind(self, dataset: Dataset) -> None:
        """Convert the offsets and open the windowed keys of ``dataset``."""
        self._convert(dataset_fps(dataset), dataset.fields, f"dataset {dataset.name!r}")
        self._dataset, self._mixture_offsets = dataset, None
        self._open(in_memory=False)

    def _open(self, *, in_memory: bool) -> None:
        """Build read plans: a stored key's rows straight from its column, a derived key (e.g.
        ``next/observation``) through the source's gather. Unpacked: a packed block would need
        every window step's episode."""
        dataset = self._dataset
        assert dataset is not None
        self._in_memory = in_memory
        fields = dataset.manifest.fields
        source = HostSource(dataset, list(self.steps), in_memory=in_memory, pack=False)
        self._episodes = source.episode_bounds  # with its step -> episode table, if any
        stored = stored_keys(fields, list(self.steps))
        self._groups = []
        for steps, keys in self._grouped().items():
            direct = [(k, fields[k].storage == "flat") for k in keys if k in stored]
            rest = [k for k in keys if k not in stored]
            other = HostSource(dataset, rest, in_memory=in_memory, pack=False) if rest else None
            self._groups.append((np.asarray(steps, np.int64), keys, self._reader(source, direct, other)))

    @staticmethod
    def _reader(
        source: HostSource, direct: list[tuple[str, bool]], other: HostSource | None
    ) -> Callable[[np.ndarray, np.ndarray], TedBatch]:
        def read(steps: np.ndarray, episode: np.ndarray) -> TedBatch:
            out = other.gather(steps) if other is not None else TedBatch()
            # a flat key's row of step t is t + episode (one final observation per episode before)
            flat_rows = steps + episode[..., None] if any(flat for _, flat in direct) else steps
            for key, flat in direct:
                out[key] = source.take_rows(key, flat_rows if flat else steps)
            return out

        return read

    def bind_source(self, source: Any) -> None:
        """Bind to a :class:`~rlds_cli.loader.mixture.MixtureSource`: windows never cross from
        one dataset into the next (each dataset's episodes are the mixture's)."""
        # duck-typed: importing the mixture module here would be circular
        if not all(hasattr(source, a) for a in ("datasets", "names", "like", "offsets", "episodes")):
            raise ValueError(
                f"windows need a dataset or a MixtureSource to read from, not {type(source).__name__}"
            )
        fps = {dataset_fps(ds) for ds in source.datasets}
        self._convert(fps.pop() if len(fps) == 1 else None, source.keys, "the mixture")
        self._dataset, self._episodes = None, source.episodes
        self._mixture_offsets = source.offsets
        self._groups = []
        for steps, keys in self._grouped().items():
            # the same sources, renames, padding and per-source transforms, over these keys
            part = source.like(keys)
            self._groups.append((np.asarray(steps, np.int64), keys, self._mixture_reader(part)))

    @staticmethod
    def _mixture_reader(part: Any) -> Callable[[np.ndarray, np.ndarray], TedBatch]:
        def read(steps: np.ndarray, episode: np.ndarray) -> TedBatch:
            return TedBatch(part.gather(steps))

        return read

    def collate(self, batch: TedBatch) -> TedBatch:
        """``collate_fn`` for the batches of the ``torch.utils.data`` adapters (e.g.
        ``TedDataLoader(TedIterableDataset(...), collate_fn=windows.collate)``): the windows
        added in the worker, then every array as a tensor. Bind to the dataset first."""
        import torch

        out = self(TedBatch(batch))
        return TedBatch({key: torch.as_tensor(value) for key, value in out.items()})

    def claim(self, keys: Sequence[str], *, in_memory: bool = False) -> list[str]:
        """Of the ``keys`` a loader is about to read, the windowed ones (built here instead);
        with ``in_memory``, their columns are copied into RAM here."""
        if self._dataset is None:
            raise RuntimeError("Windows must be bound to a dataset before claim()")
        mine = [k for k in keys if k in self.steps]
        if in_memory and mine:
            self._open(in_memory=True)
        return mine

    def __call__(self, batch: TedBatch) -> TedBatch:
        if self._episodes is None:
            raise RuntimeError("Windows must be bound to a dataset (use Loader(..., windows=...))")
        idx = np.asarray(batch["index"], np.int64)
        if self._mixture_offsets is not None:  # a mixture's index is each row's step in its dataset
            idx = idx + self._mixture_offsets.take(np.asarray(batch["source"], np.int64))
        episode = self._episodes.episode_of(idx)
        first = self._episodes.starts.take(episode)[..., None]
        last = self._episodes.ends.take(episode)[..., None] - 1
        for offsets, keys, gather in self._groups:
            wanted = idx[..., None] + offsets
            got = gather(np.minimum(np.maximum(wanted, first), last), episode)  # LeRobot: clamp
            pad = (wanted < first) | (wanted > last)
            for key in keys:
                batch[key] = got[key]
                batch[key + PAD_SUFFIX] = pad
        return batch


def with_windows(
    windows: Mapping[str | tuple[str, ...], Offsets] | None, transform: Any, source: Any = None
) -> Any:
    """``transform`` (``None``, one or a list) with a :class:`Windows` first, when ``windows``.

    For a loader over a ``source`` (a mixture), the windows are bound to it here and returned as a
    plain function (the loader binds transforms to datasets only).
    """
    if windows is None:
        return transform
    chain = [] if transform is None else list(transform) if isinstance(transform, Sequence) else [transform]
    made = windows if isinstance(windows, Windows) else Windows(windows)
    if source is None:
        return [made, *chain]
    made.bind_source(source)
    return [made.__call__, *chain]


def lerobot_names(batch: Mapping[str, Any]) -> dict[str, Any]:
    """``batch`` under LeRobot's key names (``/`` back to ``.``: ``observation/state`` is
    ``observation.state``, ``observation/state_is_pad`` is ``observation.state_is_pad``)."""
    return {key.replace("/", "."): value for key, value in batch.items()}


class PrevActionReward:
    """Adds ``prev_action`` (the action of step ``t - 1``), ``prev_reward`` (its reward,
    float32, ``[..., columns]``), ``rl2s`` (the two concatenated, float32, AMAGO's layout:
    reward then flattened action) and ``time_idx`` (int64, ``t`` minus its episode's first step).
    At an episode's first step the previous action and reward are zeros.
    """

    needs_host = True

    def __init__(self) -> None:
        self._source: HostSource | None = None
        self._episodes: Episodes | None = None

    def bind(self, dataset: Dataset) -> None:
        """Open the actions, rewards and episode bounds."""
        self._source = HostSource(dataset, ["action", "next/reward"])
        self._episodes = Episodes.of(dataset)

    def __call__(self, batch: TedBatch) -> TedBatch:
        if self._source is None or self._episodes is None:
            raise RuntimeError("PrevActionReward must be bound to a dataset (use it in a Loader)")
        idx = np.asarray(batch["index"], np.int64)
        start = self._episodes.starts[self._episodes.episode_of(idx)]
        first = idx == start
        prev = self._source.gather(np.where(first, idx, idx - 1))  # a valid row; zeroed below
        action = np.where(first.reshape(*first.shape, *([1] * (prev["action"].ndim - idx.ndim))),
                          0, prev["action"]).astype(prev["action"].dtype)  # fmt: skip
        reward = prev["next/reward"].astype(np.float32).reshape(*idx.shape, -1)
        reward = np.where(first[..., None], np.float32(0), reward)
        batch["prev_action"] = action
        batch["prev_reward"] = reward
        flat_action = action.reshape(*idx.shape, -1).astype(np.float32)
        batch["rl2s"] = np.concatenate([reward, flat_action], axis=-1)
        batch["time_idx"] = idx - start
        return batch
