"""Synthetic benchmark data: the same episodes as a D4RL HDF5 file and as a Minari dataset.

Both writers stream the data in chunks of whole episodes, so memory use does not grow with
the number of steps (a 10M-step file is written with the same few tens of MB as a 1M one).

The episodes are deterministic functions of ``(seed, chunk index)``: observations are standard
normal float32 rows (``obs_dim`` wide), actions uniform in ``[-1, 1]`` (``act_dim`` wide),
rewards standard normal float32, and every episode has ``episode_len`` steps and ends by a time
limit (truncated, never terminated); the last episode is shorter when ``n_steps`` is not a
multiple of ``episode_len``.

* :func:`write_d4rl` writes the flat D4RL layout that the d4rl MuJoCo generators produce:
  root datasets ``observations``, ``actions``, ``rewards``, ``terminals``, ``timeouts`` and
  ``next_observations`` (N rows each, contiguous, uncompressed), where
  ``next_observations[i]`` is ``observations[i + 1]`` inside an episode and the episode's real
  final observation at its end. (d4rl's own generator gzip-compresses its datasets; random data
  would not compress anyway, and uncompressed files time the converter rather than zlib.)
* :func:`write_minari` writes the Minari 0.5.x HDF5 layout:
  ``<root>/<dataset_id>/data/main_data.hdf5`` with one ``episode_{i}`` group per episode
  (attributes ``id`` and ``total_steps``; ``observations`` with T+1 rows, ``actions``,
  ``rewards``, ``terminations``, ``truncations`` with T rows, chunked and resizable as
  Minari's ``_add_episode_to_group`` creates them, and an empty ``infos`` group), plus
  ``data/metadata.json`` with the keys and JSON-string spaces that
  ``minari.create_dataset_from_buffers`` writes, and ``namespace_metadata.json`` for a
  namespaced id. ``minari.load_dataset`` and TorchRL's ``MinariExperienceReplay`` with
  ``load_from_local_minari=True`` (``MINARI_DATASETS_PATH=<root>``) read it.

Pixel data (:func:`iter_pixel_episodes`, :func:`write_pixel_d4rl`): ``uint8`` frames of shape
(3, 84, 84) in episodes of 30-2,000 steps drawn from the seed; each episode has a random background
and every frame changes one random 12 x 12 patch of it (so LZ4 finds some redundancy, as in game
frames, unlike pure noise); actions are one int64 in ``[0, 18)``, rewards standard normal. The same
generator feeds the zarr benchmark (as builder blocks) and the pixel section (as a D4RL file).

Run as a script to write a file by hand::

    python benchmarks/data.py d4rl OUT.hdf5 --steps 1000000
    python benchmarks/data.py d4rl-generated OUT.hdf5 --steps 1000000   # gzip, infos/, metadata/
    python benchmarks/data.py minari ROOT --dataset-id bench/synthetic-v0 --steps 1000000
    python benchmarks/data.py pixels OUT.hdf5 --steps 30000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

# numpy and h5py are imported where they are used, so that the benchmark driver can read the
# constants below without loading them (its own memory stays small; see run_all.py).
if TYPE_CHECKING:
    import numpy as np

OBS_DIM = 17
ACT_DIM = 6
EPISODE_LEN = 1000
#: Whole episodes generated (and held in memory) at a time.
CHUNK_EPISODES = 100
#: The Minari version whose layout is written (one of those minari 0.5.4 supports).
MINARI_VERSION = "0.5.4"
#: Pixel frames: shape, and the range episode lengths are drawn from (short and long alike).
FRAME = (3, 84, 84)
PIXEL_EPISODE_LENGTHS = (30, 2000)
#: The note the sections on generated frames open with.
NOISE_NOTE = (
    "Generated frames (a random background per episode and one changing patch a frame): the "
    "worst case for compression and for reads from compressed chunks. The *Real frames* section "
    "measures the same paths on real Atari frames."
)


@dataclass(frozen=True)
class EpisodeChunk:
    """Consecutive whole episodes, in Minari's per-episode form.

    Attributes:
        first_episode: Index of the first episode in the chunk.
        lengths: Steps per episode (T_j).
        observations: ``sum(T_j + 1)`` rows: each episode's T_j observations and its final one.
        actions: ``sum(T_j)`` rows.
        rewards: ``sum(T_j)`` values.
    """

    first_episode: int
    lengths: np.ndarray
    observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray

    @property
    def num_steps(self) -> int:
        return int(self.lengths.sum())

    def obs_offsets(self) -> np.ndarray:
        """Start row of each episode in :attr:`observations` (plus the end)."""
        import numpy as np

        return np.concatenate([[0], np.cumsum(self.lengths + 1)])

    def step_offsets(self) -> np.ndarray:
        """Start row of each episode in :attr:`actions` (plus the end)."""
        import numpy as np

        return np.concatenate([[0], np.cumsum(self.lengths)])


def episode_lengths(n_steps: int, episode_len: int = EPISODE_LEN) -> np.ndarray:
    """Episode lengths for ``n_steps`` steps: full episodes, then a shorter last one if needed."""
    import numpy as np

    if n_steps <= 0 or episode_len <= 0:
        raise ValueError("n_steps and episode_len must be positive")
    full, rest = divmod(n_steps, episode_len)
    lengths = np.full(full, episode_len, np.int64)
    return np.append(lengths, rest) if rest else lengths


def iter_chunks(
    n_steps: int,
    *,
    obs_dim: int = OBS_DIM,
    act_dim: int = ACT_DIM,
    episode_len: int = EPISODE_LEN,
    seed: int = 0,
    chunk_episodes: int = CHUNK_EPISODES,
) -> Iterator[EpisodeChunk]:
    """Yield the dataset as chunks of at most ``chunk_episodes`` whole episodes."""
    import numpy as np

    lengths = episode_lengths(n_steps, episode_len)
    for index, first in enumerate(range(0, len(lengths), chunk_episodes)):
        lens = lengths[first : first + chunk_episodes]
        rng = np.random.default_rng((seed, index))
        steps = int(lens.sum())
        obs = rng.standard_normal((steps + len(lens), obs_dim), dtype=np.float32)
        actions = rng.random((steps, act_dim), dtype=np.float32) * 2 - 1
        rewards = rng.standard_normal(steps, dtype=np.float32)
        yield EpisodeChunk(first, lens, obs, actions, rewards)


#: What D4RL's MuJoCo generator (``scripts/generation/mujoco/collect_data.py``) writes beside the
#: transitions: per-step ``infos/`` arrays (float32) and the ``metadata/`` of the policy.
GENERATOR_INFOS = {"infos/qpos": (6,), "infos/qvel": (6,), "infos/action_log_probs": ()}


@contextlib.contextmanager
def d4rl_file(
    path: str | Path, n_steps: int, obs: tuple[Any, ...], act: tuple[Any, ...], *, generated: bool = False
) -> Iterator[Any]:
    """An HDF5 file in the D4RL layout being written: root datasets ``observations`` and
    ``next_observations`` (``obs``: shape then dtype of a row), ``actions`` (``act``: the same),
    ``rewards`` float32, ``terminals`` and ``timeouts`` bool, ``n_steps`` rows each, contiguous and
    uncompressed, for the caller to fill; written as ``.partial`` and renamed once complete.

    ``generated``: as D4RL's generator writes its files instead: every array
    ``compression='gzip'`` in h5py's automatic chunks, plus :data:`GENERATOR_INFOS` and
    ``metadata/`` (:func:`put_episodes` fills the infos with standard normal rows)."""
    import h5py
    import numpy as np

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    how = {"compression": "gzip"} if generated else {}
    with h5py.File(tmp, "w") as f:
        for key, (shape, dtype) in [("observations", (obs[:-1], obs[-1])), ("actions", (act[:-1], act[-1]))]:
            f.create_dataset(key, (n_steps, *shape), dtype, **how)
        for key, dtype in [("rewards", np.float32), ("terminals", np.bool_), ("timeouts", np.bool_)]:
            f.create_dataset(key, (n_steps,), dtype, **how)
        f.create_dataset("next_observations", (n_steps, *obs[:-1]), obs[-1], **how)
        if generated:
            for key, shape in GENERATOR_INFOS.items():
                f.create_dataset(key, (n_steps, *shape), np.float32, **how)
            f["metadata/algorithm"] = "SAC"
            f["metadata/iteration"] = np.int32(1_000_000)
            f["metadata/policy/fc0/weight"] = np.zeros((256, *obs[:-1]), np.float32)
        yield f
    tmp.replace(path)


def put_episodes(f: Any, row: int, observations: Any, lengths: Any, actions: Any, rewards: Any) -> int:
    """Write whole episodes at ``row`` of a :func:`d4rl_file` (every episode ends by a time limit):
    ``observations`` holds each episode's ``T + 1`` rows (its last the final observation), then
    ``T`` actions and rewards each. Returns the row after them."""
    import numpy as np

    offsets = np.concatenate([[0], np.cumsum(np.asarray(lengths) + 1)])
    is_final = np.zeros(len(observations), bool)
    is_final[offsets[1:] - 1] = True
    is_first = np.zeros(len(observations), bool)
    is_first[offsets[:-1]] = True
    n = len(actions)
    timeouts = np.zeros(n, bool)
    timeouts[np.cumsum(lengths) - 1] = True
    rows = slice(row, row + n)
    f["observations"][rows] = observations[~is_final]
    f["next_observations"][rows] = observations[~is_first]
    f["actions"][rows] = actions
    f["rewards"][rows] = np.asarray(rewards).reshape(-1)
    for key in GENERATOR_INFOS:
        if key in f:  # a generated file (d4rl_file): the env state the generator logs, as noise
            f[key][rows] = np.random.default_rng(row).standard_normal((n, *f[key].shape[1:]), np.float32)
    f["terminals"][rows] = False
    f["timeouts"][rows] = timeouts
    return row + n


def write_d4rl(
    path: str | Path,
    n_steps: int,
    *,
    obs_dim: int = OBS_DIM,
    act_dim: int = ACT_DIM,
    episode_len: int = EPISODE_LEN,
    seed: int = 0,
    generated: bool = False,
) -> Path:
    """Write a D4RL-format file of ``n_steps`` steps (see the module docstring; ``generated``: as
    D4RL's generator writes it, see :func:`d4rl_file`).

    Returns:
        The path written.
    """
    import numpy as np

    with d4rl_file(path, n_steps, (obs_dim, np.float32), (act_dim, np.float32), generated=generated) as f:
        row = 0
        for c in iter_chunks(n_steps, obs_dim=obs_dim, act_dim=act_dim, episode_len=episode_len, seed=seed):
            row = put_episodes(f, row, c.observations, c.lengths, c.actions, c.rewards)
    return Path(path)


def iter_pixel_episodes(
    n_steps: int, *, seed: int = 0, lengths: tuple[int, int] = PIXEL_EPISODE_LENGTHS
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Yield ``(frames, actions, rewards)`` per episode until ``n_steps`` steps (the last episode is
    cut short to fit): ``T + 1`` frames (the last is the final observation), ``T`` actions of shape
    (1,) int64 and ``T`` rewards of shape (1,) float32. Memory: one episode at a time."""
    import numpy as np

    rng = np.random.default_rng(seed)
    done = 0
    while done < n_steps:
        n = min(int(rng.integers(lengths[0], lengths[1] + 1)), n_steps - done)
        frames = np.empty((n + 1, *FRAME), np.uint8)
        frames[:] = rng.integers(0, 256, FRAME, np.uint8)
        ys, xs = rng.integers(0, FRAME[1] - 12, n + 1), rng.integers(0, FRAME[2] - 12, n + 1)
        patch = rng.integers(0, 256, (n + 1, FRAME[0], 12, 12), np.uint8)
        for t in range(n + 1):
            frames[t, :, ys[t] : ys[t] + 12, xs[t] : xs[t] + 12] = patch[t]
        actions = rng.integers(0, 18, (n, 1)).astype(np.int64)
        rewards = rng.standard_normal((n, 1), np.float32)
        yield frames, actions, rewards
        done += n


def noise_pixel_blocks(steps: int) -> Iterator[Any]:
    """Builder blocks of random ``uint8`` (3, 84, 84) pixels, one episode of 30-2,000 steps each
    (the frame-stack and DataLoader sections' data: frames whose content does not matter)."""
    import numpy as np

    rng = np.random.default_rng(0)
    done = 0
    while done < steps:  # one episode per block: memory stays at one episode of frames
        n = min(int(rng.integers(PIXEL_EPISODE_LENGTHS[0], PIXEL_EPISODE_LENGTHS[1] + 1)), steps - done)
        action, reward = rng.integers(0, 18, (n, 1)).astype(np.int64), rng.standard_normal((n, 1), np.float32)
        yield step_block(action, reward, rng.integers(0, 256, (n + 1, *FRAME), np.uint8), [n - 1])
        done += n


def pixel_blocks(steps: int) -> Iterator[Any]:
    """Builder blocks of :func:`iter_pixel_episodes`, one episode each (same seed: same blocks)."""
    for frames, actions, rewards in iter_pixel_episodes(steps):
        yield step_block(actions, rewards, frames, [len(actions) - 1])


def lowdim_blocks(
    steps: int, length: int = 1000, obs_dim: int = OBS_DIM, act_dim: int = ACT_DIM
) -> Iterator[Any]:
    """Builder blocks of 100 low-dim episodes (``obs_dim`` float32 observations, 17 by default;
    ``act_dim`` float32 actions, 6 by default)."""
    import numpy as np

    rng = np.random.default_rng(0)
    done = 0
    while done < steps:
        episodes = min(100, -(-(steps - done) // length))
        n = min(episodes * length, steps - done)
        ends = np.arange(length - 1, n, length)
        if len(ends) == 0 or ends[-1] != n - 1:
            ends = np.append(ends, n - 1)
        action, reward = (
            rng.standard_normal((n, act_dim), np.float32),
            rng.standard_normal((n, 1), np.float32),
        )
        yield step_block(action, reward, rng.standard_normal((n + len(ends), obs_dim), np.float32), ends)
        done += n


def step_block(action: Any, reward: Any, observation: Any, ends: Any, *, terminated: bool = False) -> Any:
    """One ``DatasetBuilder`` block whose episodes end at rows ``ends``: by a time limit
    (``next/truncated``), or by termination with ``terminated``."""
    import numpy as np

    from rlds_cli.formats.base import StepBlock

    flags, other = np.zeros((len(action), 1), bool), np.zeros((len(action), 1), bool)
    flags[np.asarray(ends)] = True
    done = (flags, other) if terminated else (other, flags)
    return StepBlock(
        steps={
            "action": action,
            "next/reward": reward,
            "next/terminated": done[0],
            "next/truncated": done[1],
        },
        observations={"observation": observation},
        ends=np.asarray(ends),
    )


def build(root: Path, name: str, blocks: Iterable[Any], backend: str = "memmap", **kw: Any) -> dict[str, Any]:
    """Write dataset ``name`` under ``root`` from ``blocks`` (any previous copy removed first,
    untimed): the CPU and wall seconds of the builder's appends and commit (the generation of
    the blocks left out), and the files and bytes written."""
    import time

    from rlds_cli.cache.builder import DatasetBuilder
    from rlds_cli.cache.opening import open_dataset

    spent = [0.0, 0.0]  # CPU, wall

    def timed(call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        c, w = time.process_time(), time.perf_counter()
        call(*args, **kwargs)
        spent[0], spent[1] = spent[0] + time.process_time() - c, spent[1] + time.perf_counter() - w

    shutil.rmtree(Path(root) / "datasets" / name, ignore_errors=True)
    with DatasetBuilder(name, root=root, backend=backend, **kw) as builder:
        for block in blocks:
            timed(builder.append, block)
        timed(builder.commit, source={"generator": "benchmarks/data.py"})
    files = [p for p in (Path(open_dataset(name, root).directory) / "arrays").rglob("*") if p.is_file()]
    return {
        "cpu": spent[0],
        "wall": spent[1],
        "files": len(files),
        "bytes": sum(p.stat().st_size for p in files),
    }


def ensure(root: Path, name: str, blocks: Callable[[], Iterable[Any]], backend: str = "memmap") -> Any:
    """Dataset ``name`` under ``root``, built from ``blocks()`` (``RLDS_FSYNC=0``) the first time."""
    import os

    from rlds_cli.cache.opening import open_dataset
    from rlds_cli.errors import DatasetNotFoundError

    try:
        return open_dataset(name, root)
    except DatasetNotFoundError:
        os.environ.setdefault("RLDS_FSYNC", "0")
        build(root, name, blocks(), backend)
        return open_dataset(name, root)


def write_pixel_d4rl(path: str | Path, n_steps: int, *, seed: int = 0) -> Path:
    """Write the pixel episodes of :func:`iter_pixel_episodes` as a D4RL-format file: root datasets
    ``observations`` and ``next_observations`` (N, 3, 84, 84) uint8, ``actions`` (N, 1) int64,
    ``rewards`` (N,) float32, ``terminals`` and ``timeouts`` (N,) bool (every episode ends by a time
    limit), contiguous and uncompressed, written one episode at a time.

    Returns:
        The path written.
    """
    import numpy as np

    with d4rl_file(path, n_steps, (*FRAME, np.uint8), (1, np.int64)) as f:
        row = 0
        for frames, actions, rewards in iter_pixel_episodes(n_steps, seed=seed):
            row = put_episodes(f, row, frames, [len(actions)], actions, rewards)
    return Path(path)


def _box_space_json(shape: tuple[int, ...], low: float, high: float) -> str:
    """A Box space serialised as ``minari.serialization.serialize_space`` does (float32)."""
    size = math.prod(shape)
    return json.dumps(
        {
            "type": "Box",
            "dtype": "float32",
            "shape": list(shape),
            "low": [float(low)] * size,
            "high": [float(high)] * size,
        }
    )


def write_minari(
    root: str | Path,
    dataset_id: str,
    n_steps: int,
    *,
    obs_dim: int = OBS_DIM,
    act_dim: int = ACT_DIM,
    episode_len: int = EPISODE_LEN,
    seed: int = 0,
) -> Path:
    """Write a Minari HDF5 dataset holding the same episodes as :func:`write_d4rl`.

    Args:
        root: The Minari datasets root (what ``MINARI_DATASETS_PATH`` points at).
        dataset_id: A Minari id such as ``bench/synthetic-v0`` (a namespace becomes folders).

    Returns:
        The dataset's ``data`` directory.
    """
    import h5py
    import numpy as np

    data_dir = Path(root) / dataset_id / "data"
    if data_dir.parent.exists():
        shutil.rmtree(data_dir.parent)
    data_dir.mkdir(parents=True)
    total_episodes = 0
    with h5py.File(data_dir / "main_data.hdf5", "w") as f:
        for chunk in iter_chunks(
            n_steps, obs_dim=obs_dim, act_dim=act_dim, episode_len=episode_len, seed=seed
        ):
            obs_off = chunk.obs_offsets()
            step_off = chunk.step_offsets()
            for j, length in enumerate(chunk.lengths.tolist()):
                episode_id = chunk.first_episode + j
                group = f.create_group(f"episode_{episode_id}")
                group.attrs["id"] = episode_id
                group.attrs["total_steps"] = length
                steps = slice(step_off[j], step_off[j + 1])
                truncations = np.zeros(length, bool)
                truncations[-1] = True
                columns = {
                    "observations": chunk.observations[obs_off[j] : obs_off[j + 1]],
                    "actions": chunk.actions[steps],
                    "rewards": chunk.rewards[steps],
                    "terminations": np.zeros(length, bool),
                    "truncations": truncations,
                }
                for key, value in columns.items():
                    group.create_dataset(key, data=value, chunks=True, maxshape=(None, *value.shape[1:]))
                group.create_group("infos")
                total_episodes += 1
    metadata = {
        "total_episodes": total_episodes,
        "total_steps": n_steps,
        "data_format": "hdf5",
        "jpeg_encoding": True,
        "observation_space": _box_space_json((obs_dim,), -math.inf, math.inf),
        "action_space": _box_space_json((act_dim,), -1.0, 1.0),
        "dataset_id": dataset_id,
        "code_permalink": "benchmarks/data.py in the rlds-cli repository",
        "author": ["rlds-cli benchmarks"],
        "author_email": ["none@example.invalid"],
        "algorithm_name": "synthetic (random normal observations, uniform actions)",
        "description": "Synthetic benchmark data; the same episodes as the benchmark's D4RL file.",
        "minari_version": MINARI_VERSION,
    }
    meta_path = data_dir / "metadata.json"
    meta_path.write_text(json.dumps(metadata))
    # minari records the data directory's size in MB, rounded to 0.1
    size = sum(p.stat().st_size for p in data_dir.glob("**/*") if p.is_file()) / 1e6
    metadata["dataset_size"] = round(size, 1)
    meta_path.write_text(json.dumps(metadata))
    if "/" in dataset_id:
        namespace = Path(root) / dataset_id.rsplit("/", 1)[0]
        (namespace / "namespace_metadata.json").write_text("{}")
    return data_dir


def main(argv: list[str] | None = None) -> None:
    """Command line: write one D4RL file or one Minari dataset."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=["d4rl", "d4rl-generated", "minari", "pixels"])
    parser.add_argument("out", type=Path, help="d4rl, pixels: the .hdf5 file; minari: the datasets root")
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--dataset-id", default="bench/synthetic-v0")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.kind in ("d4rl", "d4rl-generated"):
        print(write_d4rl(args.out, args.steps, seed=args.seed, generated=args.kind == "d4rl-generated"))
    elif args.kind == "pixels":
        print(write_pixel_d4rl(args.out, args.steps, seed=args.seed))
    else:
        print(write_minari(args.out, args.dataset_id, args.steps, seed=args.seed))


if __name__ == "__main__":
    main()
