"""Gen-DGRL (Procgen) sources written the way the world writes them, for tests and benchmarks.

Two member kinds, as found in public code (facebookresearch/gen_dgrl, pytorch/rl):

* gen_dgrl's collector (``procgen/online/datasets/storage.py``): one ``np.savez_compressed``
  file per finished episode, written to a ``BytesIO`` and then to disk, named
  ``{timestamp}_{idx}_{len}_{level_seed}_{return:.2f}.npz`` (timestamp ``%Y%m%dT%H%M%S``). Its
  arrays come from torch tensors: ``observations`` float32 ``(T + 1, 3, 64, 64)`` (whole numbers
  0..255), ``actions`` int64 ``(T, 1)``, ``rewards`` float32 ``(T, 1)``. ``dones`` is saved with
  the dtype of the key before it (the collector's dtype chain matches no ``np.bool_``), so it is
  float32 ``(T,)`` of 0.0/1.0. The last observation is the *next* episode's first frame (the
  environment resets by itself at ``done``).
* TorchRL's reader (``torchrl/data/datasets/gen_dgrl.py``) loads each tar member with
  ``np.load(member, allow_pickle=True).tolist()``: a ``.npy`` of a pickled dict
  (``np.save(f, dict)``), which :func:`write_npy` writes (``dones`` bool there).

The archives are ``<game>.tar.xz`` files of those members under a ``<game>/`` folder.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: Procgen's action space: 15 discrete actions.
NUM_ACTIONS = 15


@dataclass
class Trajectory:
    """One trajectory's raw arrays and the name its file gets."""

    arrays: dict[str, np.ndarray]
    level_seed: int
    index: int

    @property
    def steps(self) -> int:
        return int(self.arrays["actions"].shape[0])

    def collector_name(self) -> str:
        """``{timestamp}_{idx}_{len}_{level_seed}_{return:.2f}.npz`` as the collector names it."""
        ret = float(np.squeeze(self.arrays["rewards"].sum()))
        return f"20231012T101500_{self.index}_{self.steps}_{self.level_seed}_{ret:.2f}.npz"


def procgen_frames(
    rng: np.random.Generator,
    rows: int,
    side: int = 64,
    *,
    constant: int | None = None,
    textured: bool = False,
) -> np.ndarray:
    """``rows`` CHW frames as float32 whole numbers 0..255 (how the collector stores them): a
    flat background with a few blocks, like a Procgen screen. ``textured`` draws them over a
    noise texture scrolling one pixel a step instead (like Procgen's textured, scrolling
    backgrounds: far less compressible than flat ones); ``constant`` gives frames of that one
    value (tiny once compressed)."""
    if constant is not None:
        return np.full((rows, 3, side, side), constant, np.float32)
    frames = np.empty((rows, 3, side, side), np.float32)
    if textured:
        texture = rng.integers(0, 256, size=(3, side, 2 * side)).astype(np.float32)
        for r in range(rows):
            start = r % side
            frames[r] = texture[:, :, start : start + side]
    else:
        frames[:] = rng.integers(0, 256, size=(1, 3, 1, 1))
    block = max(side // 8, 1)
    for r in range(rows):
        for _ in range(3):
            y, x = rng.integers(0, side - block + 1, size=2)
            frames[r, :, y : y + block, x : x + block] = rng.integers(0, 256, size=(3, 1, 1))
    return frames


def procgen_trajectory(
    rng: np.random.Generator,
    steps: int,
    *,
    index: int = 0,
    level_seed: int = 7,
    side: int = 64,
    done_at_end: bool = True,
    early_dones: Sequence[int] = (),
    constant_frames: int | None = None,
    textured: bool = False,
    dones_dtype: type = np.float32,
) -> Trajectory:
    """One trajectory in the collector's layout (see the module doc)."""
    dones: np.ndarray = np.zeros(steps, dones_dtype)
    if done_at_end and steps:
        dones[-1] = 1
    for t in early_dones:
        dones[t] = 1
    arrays = {
        "observations": procgen_frames(rng, steps + 1, side, constant=constant_frames, textured=textured),
        "actions": rng.integers(0, NUM_ACTIONS, size=(steps, 1)).astype(np.int64),
        "rewards": (rng.random((steps, 1)) < 0.1).astype(np.float32) * 10.0,
        "dones": dones,
    }
    return Trajectory(arrays, level_seed, index)


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """What the collector's ``save_episode`` writes: ``np.savez_compressed`` into a ``BytesIO``."""
    with io.BytesIO() as bs:
        np.savez_compressed(bs, **arrays)  # type: ignore[arg-type]
        return bs.getvalue()


def npy_bytes(arrays: object) -> bytes:
    """A ``.npy`` of a pickled object, as ``np.save(f, dict)`` writes it (TorchRL's members)."""
    with io.BytesIO() as bs:
        np.save(bs, arrays, allow_pickle=True)  # type: ignore[arg-type]
        return bs.getvalue()


def as_torchrl_member(traj: Trajectory) -> dict[str, np.ndarray]:
    """The same trajectory as TorchRL's pickled dict holds it (``dones`` bool)."""
    return {**traj.arrays, "dones": traj.arrays["dones"].astype(bool)}


def write_tar(
    archive: Path, members: Sequence[tuple[str, bytes]], *, mode: str = "w:xz", preset: int = 1
) -> Path:
    """A tar archive of ``(name, bytes)`` members (``w:xz`` by default, as the release is)."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    kwargs = {"preset": preset} if mode == "w:xz" else {}
    with tarfile.open(archive, mode, **kwargs) as tf:  # type: ignore[call-overload]
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1_700_000_000
            tf.addfile(info, io.BytesIO(data))
    return archive


def members_of(
    trajectories: Sequence[Trajectory], game: str = "bigfish", kinds: str = "mixed"
) -> list[tuple[str, bytes]]:
    """Archive members for ``trajectories``: ``kinds`` is ``"npz"`` (collector files), ``"npy"``
    (TorchRL's pickled dicts) or ``"mixed"`` (alternating, npz first)."""
    out = []
    for i, traj in enumerate(trajectories):
        npz = kinds == "npz" or (kinds == "mixed" and i % 2 == 0)
        name = traj.collector_name()
        if npz:
            out.append((f"{game}/{name}", npz_bytes(traj.arrays)))
        else:
            out.append((f"{game}/{name[:-4]}.npy", npy_bytes(as_torchrl_member(traj))))
    return out


def gen_dgrl_archive(
    archive: Path,
    *,
    episodes: int = 4,
    steps: int = 20,
    side: int = 64,
    kinds: str = "mixed",
    seed: int = 0,
    constant_frames: int | None = None,
    textured: bool = False,
    preset: int = 1,
) -> tuple[Path, list[Trajectory]]:
    """A ``<game>.tar.xz`` of ``episodes`` trajectories (lengths ``steps``, ``steps + 1``, ...),
    and the trajectories in archive order."""
    rng = np.random.default_rng(seed)
    trajectories = [
        procgen_trajectory(
            rng,
            steps + i,
            index=i,
            level_seed=100 + i,
            side=side,
            constant_frames=constant_frames,
            textured=textured,
        )
        for i in range(episodes)
    ]
    write_tar(archive, members_of(trajectories, kinds=kinds), preset=preset)
    return archive, trajectories


def write_folder(folder: Path, trajectories: Sequence[Trajectory], kinds: str = "npz") -> Path:
    """Loose trajectory files in ``folder`` (the collector's own output, or TorchRL's members)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in members_of(trajectories, game=".", kinds=kinds):
        (folder / Path(name).name).write_bytes(data)
    return folder
