"""Regenerate the bundled demo file and print the numbers the registry entry needs.

A 2-D point mass, stepped with numpy under a scripted noisy PD policy, written as D4RL HDF5.

The episodes end the three ways a D4RL file knows: reaching the goal (``terminals``), the time
limit (``timeouts``), and the file simply ending in the middle of the last episode. The file is
what ``registry/demo.toml`` ships as ``pointmass-demo-v0``; this script
regenerates it, and a test checks that the shipped arrays equal a fresh run.

Usage: python scripts/make_demo_dataset.py [OUTPUT]
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlds_cli._util.io import sha256_file

ENV_NAME = "PointMass2D-v0"
MAX_EPISODE_STEPS = 100
DEFAULT_STEPS = 5000
DEFAULT_SEED = 7
_DT = 0.1
_DAMPING = 0.9
_GOAL_RADIUS = 0.05


@dataclass
class Rollouts:
    """Concatenated D4RL-style rows."""

    observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminals: np.ndarray
    timeouts: np.ndarray
    next_observations: np.ndarray
    qpos: np.ndarray
    qvel: np.ndarray
    goal: np.ndarray


def _observe(pos: np.ndarray, vel: np.ndarray, goal: np.ndarray) -> np.ndarray:
    return np.concatenate([pos, vel, goal - pos]).astype(np.float32)


def simulate(total_steps: int = DEFAULT_STEPS, seed: int = DEFAULT_SEED) -> Rollouts:
    """Roll out episodes until exactly ``total_steps`` rows exist (the last one is cut)."""
    rng = np.random.default_rng(seed)
    rows: dict[str, list[np.ndarray | np.generic]] = {k: [] for k in Rollouts.__dataclass_fields__}
    while len(rows["actions"]) < total_steps:
        pos = rng.uniform(-1, 1, 2)
        vel = np.zeros(2)
        goal = rng.uniform(-1, 1, 2)
        noise = rng.choice([0.2, 0.6, 1.5])  # some episodes reach the goal, some time out
        gain = rng.uniform(0.8, 2.0)
        for t in range(MAX_EPISODE_STEPS):
            if len(rows["actions"]) == total_steps:
                break
            obs = _observe(pos, vel, goal)
            action = np.clip(gain * (goal - pos) - 0.5 * vel + noise * rng.normal(size=2), -1, 1)
            rows["qpos"].append(pos.astype(np.float32))
            rows["qvel"].append(vel.astype(np.float32))
            rows["goal"].append(goal.astype(np.float32))
            vel = _DAMPING * vel + _DT * action
            pos = np.clip(pos + _DT * vel, -1.2, 1.2)
            dist = float(np.linalg.norm(goal - pos))
            reached = dist < _GOAL_RADIUS
            rows["observations"].append(obs)
            rows["actions"].append(action.astype(np.float32))
            rows["rewards"].append(np.float32(-dist + (10.0 if reached else 0.0)))
            rows["terminals"].append(np.bool_(reached))
            rows["timeouts"].append(np.bool_(not reached and t == MAX_EPISODE_STEPS - 1))
            rows["next_observations"].append(_observe(pos, vel, goal))
            if reached:
                break
    return Rollouts(**{k: np.stack(v) for k, v in rows.items()})


def write_d4rl_file(path: str | Path, rollouts: Rollouts) -> None:
    """Write rollouts in the D4RL layout (gzip-compressed, without timestamps)."""
    import h5py

    opts = {"compression": "gzip", "compression_opts": 9, "shuffle": True, "track_times": False}
    with h5py.File(path, "w", track_order=True) as f:
        f.create_dataset("observations", data=rollouts.observations, **opts)
        f.create_dataset("actions", data=rollouts.actions, **opts)
        f.create_dataset("rewards", data=rollouts.rewards, **opts)
        f.create_dataset("terminals", data=rollouts.terminals, **opts)
        f.create_dataset("timeouts", data=rollouts.timeouts, **opts)
        f.create_dataset("next_observations", data=rollouts.next_observations, **opts)
        f.create_dataset("infos/qpos", data=rollouts.qpos, **opts)
        f.create_dataset("infos/qvel", data=rollouts.qvel, **opts)
        f.create_dataset("infos/goal", data=rollouts.goal, **opts)
        f.create_dataset("metadata/algorithm", data="scripted-noisy-pd")
        f.create_dataset("metadata/env", data=ENV_NAME)
        f["metadata"].attrs["max_episode_steps"] = MAX_EPISODE_STEPS


def bundled_path() -> Path:
    """The demo file shipped inside the package."""
    import rlds_cli

    return Path(rlds_cli.__file__).resolve().parent / "data" / "pointmass-demo-v0.hdf5"


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else bundled_path()
    rollouts = simulate()
    write_d4rl_file(out, rollouts)
    ends = rollouts.terminals | rollouts.timeouts
    print(f"wrote {out}")
    print(f"size = {out.stat().st_size}")
    print(f'sha256 = "{sha256_file(out)}"')
    print(
        f"rows = {len(rollouts.actions)}, terminals = {int(rollouts.terminals.sum())}, "
        f"timeouts = {int(rollouts.timeouts.sum())}, episodes = {int(ends.sum()) + int(not ends[-1])}"
    )
    print(f"reward mean = {float(np.mean(rollouts.rewards)):.4f}")


if __name__ == "__main__":
    main()
