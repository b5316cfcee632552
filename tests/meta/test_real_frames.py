"""benchmarks/real_frames.py: the DQN preprocessing on synthetic screens, and (when ale-py is
installed: the bench venv, not CI) a tiny generated file's D4RL invariants."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
pytest.importorskip("PIL")

import real_frames


def test_preprocess_pools_the_two_screens_then_area_averages() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 256, (2, 168, 168), dtype=np.uint8)
    out = real_frames.preprocess(np.stack([a, b]))
    assert out.shape == (84, 84) and out.dtype == np.uint8
    # 168 -> 84 is an exact 2x2 area mean of the max-pooled screen
    want = np.maximum(a, b).reshape(84, 2, 84, 2).astype(np.float64).mean(axis=(1, 3))
    assert np.abs(out.astype(np.float64) - want).max() <= 1.0


def test_preprocess_rgb_keeps_channels_last_and_matches_per_channel_gray() -> None:
    rng = np.random.default_rng(1)
    screens = rng.integers(0, 256, (2, 210, 160, 3), dtype=np.uint8)
    out = real_frames.preprocess(screens)
    assert out.shape == (84, 84, 3)
    for c in range(3):
        np.testing.assert_array_equal(out[..., c], real_frames.preprocess(screens[..., c]))


def test_generated_episodes_follow_the_d4rl_layout(tmp_path: Path) -> None:
    pytest.importorskip("ale_py")
    import h5py

    path = tmp_path / "f.hdf5"
    real_frames.generate(path, "gray", 60, seed=0, games=("pong", "breakout"))
    with h5py.File(path) as f:
        obs, nxt = f["observations"][:], f["next_observations"][:]
        ends = f["terminals"][:] | f["timeouts"][:]
        assert obs.shape == (60, 84, 84) and f["actions"].shape == (60,)
    assert ends[29] and ends[59]  # each game's share ends an episode (truncated)
    inside = ~ends[:-1]
    np.testing.assert_array_equal(obs[1:][inside], nxt[:-1][inside])
    assert len({frame.tobytes() for frame in obs}) > 10  # the screen changes
