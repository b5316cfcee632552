"""Dopamine replay logs written the way Dopamine and batch_rl write them, at any size.

The DQN Replay Dataset (``gs://atari-replay-datasets/dqn/<Game>/<run>/replay_logs/``) was logged by
batch_rl's ``OutOfGraphLoggedReplayBuffer``, a subclass of Dopamine's ``OutOfGraphReplayBuffer``.
:class:`DopamineBuffer` re-implements the storage side of that buffer (not its sampling):

* four store arrays of ``capacity`` rows: ``observation`` ``(C, 84, 84)`` uint8, ``action``
  ``(C,)`` int32, ``reward`` ``(C,)`` float32, ``terminal`` ``(C,)`` uint8;
* ``add``: when the buffer is empty or the previous row is terminal, ``stack_size - 1`` zero rows
  (observation, action, reward and terminal all 0) are added first, then the row itself; each
  row goes to slot ``add_count % capacity`` and ``add_count`` (a 0-d int64 array) grows by one;
* ``invalid_range`` after each add: ``[(cursor - update_horizon + i) % capacity for i in
  range(stack_size + update_horizon)]`` (before the first add: ``np.zeros(stack_size)``, float);
* ``save``: one file per array, ``<name>_ckpt.<N>.gz``, written by ``np.save(allow_pickle=False)``
  into a ``gzip.GzipFile``; the store arrays' names carry the ``$store$_`` prefix.

:class:`LoggedBuffer` adds batch_rl's rule: after an ``add`` that leaves the cursor at
``capacity - 1`` the buffer is logged as checkpoint ``log_count`` (then ``log_count += 1``), and
``log_final_buffer`` logs what is left with ``add_count`` replaced by the cursor.

:func:`write_run` plays episodes through a logged buffer the way Dopamine's DQN agent stores them:
each step adds ``(frame before the action, action, reward, terminal=False)``, the last step of an
episode adds ``terminal=True``; the frame after the last step is never stored. Frame ``k`` of the
run (``k`` counts env steps from 0) holds ``k`` in its first 8 bytes (little-endian) and a non-zero
fill elsewhere, so a test can tell which env step any stored frame is; :func:`frame_id` reads it.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

STORE_PREFIX = "$store$_"
STORE = ("observation", "action", "reward", "terminal")


def file_name(name: str, checkpoint: int) -> str:
    """Dopamine's ``_generate_filename``: ``'{}_ckpt.{}.gz'.format(name, suffix)``."""
    return f"{name}_ckpt.{checkpoint}.gz"


def save_array(path: Path, array: np.ndarray, *, compresslevel: int = 9) -> None:
    """One checkpoint file as Dopamine writes it: ``np.save`` through ``gzip.GzipFile``."""
    with open(path, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", compresslevel=compresslevel) as out:
        np.save(out, array, allow_pickle=False)


def save_checkpoint(
    folder: Path,
    checkpoint: int,
    store: dict[str, np.ndarray],
    add_count: int | np.ndarray,
    invalid_range: np.ndarray,
    *,
    compresslevel: int = 9,
) -> list[Path]:
    """The six files of one checkpoint (store arrays with the ``$store$_`` prefix, then
    ``add_count`` and ``invalid_range``); returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in STORE:
        path = folder / file_name(STORE_PREFIX + name, checkpoint)
        save_array(path, store[name], compresslevel=compresslevel)
        paths.append(path)
    for name, value in (("add_count", np.asarray(add_count)), ("invalid_range", np.asarray(invalid_range))):
        path = folder / file_name(name, checkpoint)
        save_array(path, value, compresslevel=compresslevel)
        paths.append(path)
    return paths


def invalid_range(cursor: int, capacity: int, stack_size: int, update_horizon: int) -> np.ndarray:
    """Dopamine's ``invalid_range``: the ``update_horizon`` slots before the cursor, the cursor and
    the ``stack_size - 1`` slots after it."""
    return np.array([(cursor - update_horizon + i) % capacity for i in range(stack_size + update_horizon)])


class DopamineBuffer:
    """The storage of Dopamine's ``OutOfGraphReplayBuffer`` (see the module docstring)."""

    def __init__(
        self,
        capacity: int,
        *,
        obs_shape: tuple[int, ...] = (84, 84),
        stack_size: int = 4,
        update_horizon: int = 1,
        garbage: int = 0xAB,
    ) -> None:
        self.capacity, self.stack_size, self.update_horizon = capacity, stack_size, update_horizon
        # np.empty in Dopamine: slots never written hold whatever memory held; a fill the reader
        # must never return makes reading one of them visible in the tests
        self.store: dict[str, np.ndarray] = {
            "observation": np.full((capacity, *obs_shape), garbage, np.uint8),
            "action": np.full(capacity, garbage, np.int32),
            "reward": np.full(capacity, garbage, np.float32),
            "terminal": np.full(capacity, 2, np.uint8),
        }
        self.add_count = np.array(0)
        self.invalid_range = np.zeros((stack_size,))

    def cursor(self) -> int:
        return int(self.add_count) % self.capacity

    def add(self, observation: np.ndarray, action: int, reward: float, terminal: bool) -> None:
        """Dopamine's ``add``: zero padding before an episode's first row, then the row."""
        if int(self.add_count) == 0 or self.store["terminal"][self.cursor() - 1] == 1:
            for _ in range(self.stack_size - 1):
                self._add(np.zeros_like(observation), 0, 0.0, False)
        self._add(observation, action, reward, terminal)

    def _add(self, observation: np.ndarray, action: int, reward: float, terminal: bool) -> None:
        c = self.cursor()
        self.store["observation"][c] = observation
        self.store["action"][c] = action
        self.store["reward"][c] = reward
        self.store["terminal"][c] = terminal
        self.add_count += 1
        self.invalid_range = invalid_range(self.cursor(), self.capacity, self.stack_size, self.update_horizon)

    def save(
        self, folder: Path, checkpoint: int, *, add_count: int | None = None, compresslevel: int = 9
    ) -> None:
        """Dopamine's ``save``: every array of the buffer, as checkpoint ``checkpoint``."""
        count = self.add_count if add_count is None else np.array(add_count)
        save_checkpoint(
            folder, checkpoint, self.store, count, self.invalid_range, compresslevel=compresslevel
        )


class LoggedBuffer(DopamineBuffer):
    """batch_rl's ``OutOfGraphLoggedReplayBuffer``: logs itself each time the cursor reaches
    ``capacity - 1`` after an add."""

    def __init__(self, folder: Path, capacity: int, *, compresslevel: int = 9, **kwargs: object) -> None:
        super().__init__(capacity, **kwargs)  # type: ignore[arg-type]
        self.folder, self.log_count, self.compresslevel = folder, 0, compresslevel

    def add(self, observation: np.ndarray, action: int, reward: float, terminal: bool) -> None:
        super().add(observation, action, reward, terminal)
        if int(self.add_count) % self.capacity == self.capacity - 1:
            self.save(self.folder, self.log_count, compresslevel=self.compresslevel)
            self.log_count += 1

    def log_final_buffer(self) -> None:
        """What batch_rl does at the end of training: log with ``add_count`` set to the cursor."""
        self.save(self.folder, self.log_count, add_count=self.cursor(), compresslevel=self.compresslevel)
        self.log_count += 1


# ----------------------------------------------------------------------------- a run


@dataclass
class Run:
    """What :func:`write_run` played: the ground truth of every env step.

    Attributes:
        episodes: Per episode, the ids of its frames (env steps), in order.
        actions: Action of each env step, by id.
        rewards: Reward of each env step, by id.
        checkpoints: The checkpoint numbers written.
    """

    episodes: list[np.ndarray] = field(default_factory=list)
    actions: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)

    def episode_of(self) -> dict[int, tuple[int, int]]:
        """Frame id -> (episode, position in it)."""
        return {int(k): (e, t) for e, ids in enumerate(self.episodes) for t, k in enumerate(ids)}


def tagged_frame(step: int, shape: tuple[int, ...], fill: int = 0x5A) -> np.ndarray:
    """A frame holding ``step`` in its first 8 bytes and ``fill`` elsewhere (never all zero)."""
    frame = np.full(shape, fill, np.uint8)
    frame.reshape(-1)[:8] = np.frombuffer(np.int64(step).tobytes(), np.uint8)
    return frame


def frame_id(frames: np.ndarray) -> np.ndarray:
    """The env step ids of frames made by :func:`tagged_frame` (``-1`` for all-zero frames)."""
    flat = np.ascontiguousarray(frames.reshape(len(frames), -1)[:, :8])
    ids = flat.view(np.int64).reshape(-1).copy()
    ids[~frames.reshape(len(frames), -1).any(axis=1)] = -1
    return ids


def write_run(
    folder: Path,
    *,
    capacity: int,
    episode_lengths: Sequence[int],
    obs_shape: tuple[int, ...] = (84, 84),
    stack_size: int = 4,
    final_buffer: bool = True,
    compresslevel: int = 9,
    seed: int = 0,
    frame: Callable[[int, tuple[int, ...]], np.ndarray] = tagged_frame,
) -> Run:
    """Play episodes of the given lengths through a :class:`LoggedBuffer` in ``folder``
    (``replay_logs/`` of a run), as Dopamine's DQN agent stores them; log the final buffer last
    when ``final_buffer``."""
    rng = np.random.default_rng(seed)
    buf = LoggedBuffer(
        folder, capacity, compresslevel=compresslevel, obs_shape=obs_shape, stack_size=stack_size
    )
    run = Run()
    step = 0
    for length in episode_lengths:
        ids = np.arange(step, step + length)
        for t, k in enumerate(ids):
            action = int(rng.integers(0, 18))
            reward = float(rng.choice([-1.0, 0.0, 0.0, 1.0]))
            run.actions.append(action)
            run.rewards.append(reward)
            buf.add(frame(int(k), obs_shape), action, reward, t == length - 1)
        run.episodes.append(ids)
        step += length
    if final_buffer:
        buf.log_final_buffer()
    run.checkpoints = list(range(buf.log_count))
    return run


def run_folder(root: Path) -> Path:
    """``<root>/replay_logs``: where a run keeps its logs (its parent is the run folder)."""
    return root / "replay_logs"
