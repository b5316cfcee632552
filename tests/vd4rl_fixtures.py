"""V-D4RL sources written the way the world writes them (no network).

* Dreamer episodes: one file per episode, ``<YYYYmmddTHHMMSS>-<uuid4 hex>-<rows>.npz``, written
  as DreamerV2's ``save_episodes`` (and V-D4RL's ``hdf5_to_npz.py``) do: ``np.savez_compressed``
  into a ``BytesIO``, then the bytes to the file; the length in the name is the episode's row
  count (``len(episode['reward'])``). Arrays as DreamerV2's replay ``convert`` leaves them:
  floats as ``float32``, flags as ``bool``, frames ``uint8`` HWC; row 0 is the reset row (zero
  action, reward 0, ``is_first``); the last row has ``is_last``.
* drqbc shards: V-D4RL's ``npz_to_hdf5.py`` layout: ``observation (N, 3, H, W)`` uint8 CHW (the
  episodes' frames transposed; the real script also resizes 64 -> 84 with cv2), ``action``,
  ``reward``, ``discount`` (float32, from the episodes) and ``step_type`` (``float64``: the script
  builds it with ``np.ones(501)``; 0 first, 1 mid, 2 last), each written with
  ``create_dataset(k, data=v, compression='gzip')``; ``split_hdf5_shards.py`` cuts a file into
  ``{counter}.hdf5`` shards with ``np.array_split`` on rows (ignoring episode boundaries).

Every writer is parameterised by size (episodes, rows, frame side) so benchmarks reuse it.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ACTION_DIM = 6


def dreamer_episode(
    rows: int = 501,
    *,
    side: int = 64,
    seed: int = 0,
    terminal: bool = False,
    old: bool = False,
    frames: str = "random",
    action_dim: int = ACTION_DIM,
) -> dict[str, np.ndarray]:
    """One Dreamer episode of ``rows`` rows (the reset row plus ``rows - 1`` steps).

    Args:
        terminal: The environment terminated on the last row (``is_terminal``, discount 0).
        old: Leave out ``is_terminal``, as older Dreamer files do (then ``discount == 0`` says it).
        frames: ``"random"`` (incompressible noise) or ``"zeros"`` (compresses ~1000-fold).
    """
    rng = np.random.default_rng(seed)
    if frames == "zeros":
        image = np.zeros((rows, side, side, 3), np.uint8)
    else:
        image = rng.integers(0, 256, (rows, side, side, 3), dtype=np.uint8)
    action = rng.uniform(-1, 1, (rows, action_dim)).astype(np.float32)
    action[0] = 0  # the reset row: no action led to it
    reward = rng.uniform(0, 1, rows).astype(np.float32)
    reward[0] = 0
    discount = np.ones(rows, np.float32)
    is_first = np.zeros(rows, bool)
    is_first[0] = True
    is_last = np.zeros(rows, bool)
    is_last[-1] = True
    is_terminal = np.zeros(rows, bool)
    if terminal:
        is_terminal[-1] = True
        discount[-1] = 0
    episode: dict[str, np.ndarray] = {
        "image": image,
        "action": action,
        "reward": reward,
        "discount": discount,
        "is_first": is_first,
        "is_last": is_last,
        "is_terminal": is_terminal,
    }
    if old:
        del episode["is_terminal"]
    return episode


def dreamer_name(index: int, rows: int) -> str:
    """Dreamer's file name for the ``index``-th episode saved: a timestamp (one second apart,
    so name order is save order), a uuid4 hex and the row count."""
    stamp = f"20220109T01{index // 60 % 60:02d}{index % 60:02d}"
    ident = uuid.UUID(bytes=np.random.default_rng(index).bytes(16), version=4).hex
    return f"{stamp}-{ident}-{rows}.npz"


def save_episode(path: Path, episode: dict[str, np.ndarray]) -> Path:
    """Write one episode as Dreamer does: ``np.savez_compressed`` into memory, then to disk."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with io.BytesIO() as buffer:
        arrays: dict[str, Any] = dict(episode)  # (typed loosely: savez's own keywords are not arrays)
        np.savez_compressed(buffer, **arrays)
        path.write_bytes(buffer.getvalue())
    return path


def write_dreamer_episodes(folder: Path, episodes: Sequence[dict[str, np.ndarray]]) -> list[Path]:
    """A folder of Dreamer episode files, in save order; the paths written."""
    return [save_episode(folder / dreamer_name(i, len(ep["reward"])), ep) for i, ep in enumerate(episodes)]


def drqbc_arrays(episodes: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The drqbc arrays of ``episodes`` as ``npz_to_hdf5.py`` builds them (without its cv2
    resize): frames transposed to CHW, every episode's rows concatenated, ``step_type`` float64."""
    step_types = []
    for ep in episodes:
        st = np.ones(len(ep["reward"]))
        st[0] = 0
        st[-1] = 2
        step_types.append(st)
    return {
        "action": np.concatenate([ep["action"] for ep in episodes]),
        "discount": np.concatenate([ep["discount"] for ep in episodes]),
        "observation": np.concatenate([ep["image"].transpose(0, 3, 1, 2) for ep in episodes]),
        "reward": np.concatenate([ep["reward"] for ep in episodes]),
        "step_type": np.concatenate(step_types),
    }


def write_drqbc(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    """One drqbc shard: each array a gzip-compressed dataset, as the V-D4RL scripts write."""
    import h5py

    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        for key, value in arrays.items():
            f.create_dataset(key, data=value, compression="gzip")
    return path


def write_drqbc_shards(folder: Path, arrays: dict[str, np.ndarray], shards: int) -> list[Path]:
    """``split_hdf5_shards.py``: ``np.array_split`` of every array into ``shards`` row ranges
    (episodes cut anywhere), written as ``0.hdf5``, ``1.hdf5``, ..."""
    split = {k: np.array_split(v, shards) for k, v in arrays.items()}
    return [write_drqbc(folder / f"{i}.hdf5", {k: v[i] for k, v in split.items()}) for i in range(shards)]


def dreamerv2_save_episode(directory: Path, episode: dict[str, np.ndarray], timestamp: str) -> Path:
    """DreamerV2's ``save_episode`` (``dreamerv2/common/replay.py``), restated: the name counts
    ``eplen(episode) = len(episode['action']) - 1`` (the reset row is not counted); the
    timestamp (``datetime.now()`` there) is given so that name order is save order."""
    identifier = str(uuid.uuid4().hex)
    length = len(episode["action"]) - 1
    filename = directory / f"{timestamp}-{identifier}-{length}.npz"
    with io.BytesIO() as f1:
        arrays: dict[str, Any] = dict(episode)
        np.savez_compressed(f1, **arrays)
        f1.seek(0)
        with filename.open("wb") as f2:
            f2.write(f1.read())
    return filename


def vd4rl_script_save_episode(directory: Path, episode: dict[str, np.ndarray], timestamp: str) -> Path:
    """V-D4RL's ``conversion_scripts/hdf5_to_npz.py`` ``save_episode``, restated: the same
    pattern, but the name counts ``len(episode['action'])`` (every row, 501 for 500 steps)."""
    identifier = str(uuid.uuid4().hex)
    length = len(episode["action"])
    filename = directory / f"{timestamp}-{identifier}-{length}.npz"
    with io.BytesIO() as f1:
        arrays: dict[str, Any] = dict(episode)
        np.savez_compressed(f1, **arrays)
        f1.seek(0)
        with filename.open("wb") as f2:
            f2.write(f1.read())
    return filename
