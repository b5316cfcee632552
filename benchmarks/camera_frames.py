"""Real camera frames for the compressed-frames benchmark: MuJoCo renders, generated and cached.

A random policy drives three MuJoCo locomotion tasks of gymnasium (``HalfCheetah-v5``,
``Hopper-v5``, ``Walker2d-v5``) and each step's scene is rendered by MuJoCo's own camera at
224x224 RGB (``render_mode="rgb_array"``; ``MUJOCO_GL=egl`` renders in software here, ~50 ms a
frame). Episodes are cut at :data:`EPISODE_STEPS` steps; the tasks take equal shares. The frames are
cached under ``benchmarks/_work/camera_frames`` (git-ignored) as one ``.npy`` named by the count
and :data:`FORMAT`, written atomically.

Usage::

    python benchmarks/camera_frames.py [--frames 1200]   # prints the path
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CACHE = HERE / "_work" / "camera_frames"
#: Bumped whenever the generated content changes, so old cache files are not reused.
FORMAT = 1
TASKS = ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5")
SIZE = 224
EPISODE_STEPS = 200


def render(count: int, seed: int = 0) -> np.ndarray:
    """``count`` frames ``(count, 224, 224, 3)`` uint8, the tasks in equal shares, in episode order."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    import gymnasium as gym

    frames = np.empty((count, SIZE, SIZE, 3), np.uint8)
    shares = np.array_split(np.arange(count), len(TASKS))
    for task, rows in zip(TASKS, shares, strict=True):
        env = gym.make(task, render_mode="rgb_array", width=SIZE, height=SIZE)
        env.action_space.seed(seed)
        env.reset(seed=seed)
        steps = 0
        for row in rows:
            frames[row] = env.render()
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            steps += 1
            if terminated or truncated or steps == EPISODE_STEPS:
                env.reset()
                steps = 0
        env.close()
    return frames


def cached(count: int) -> Path:
    """The path of ``count`` rendered frames, rendering them the first time."""
    path = CACHE / f"mujoco-{SIZE}-{count}-v{FORMAT}.npy"
    if not path.is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        with open(tmp, "wb") as fh:
            np.save(fh, render(count))
        os.replace(tmp, path)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--frames", type=int, default=1200)
    args = p.parse_args(argv)
    print(cached(args.frames))
    return 0


if __name__ == "__main__":
    sys.exit(main())
