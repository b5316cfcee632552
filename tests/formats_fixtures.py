"""Writers of source files in the exact real layouts (Roboset H5, OGBench npz, AMAGO npz, Minari
HDF5 by hand), with values simple enough to write golden expectations by hand.

Layouts follow ``docs/formats.md`` (and the facts in the shared source-format reference):
RoboHive schema ``Trial<N>`` groups with time-aligned rows and a NaN last action; OGBench
``np.savez_compressed`` files with ``observations``/``actions``/``terminals``/``qpos``/``qvel``;
AMAGO ``FrozenTraj.to_dict`` files (``_OBS_KEY_*``, ``rl2s``, ``time_idxs``, ``rews``,
``dones``, ``actions``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np

# ----------------------------------------------------------------------------- Roboset


def roboset_trial(file_no: int, trial: int, length: int, *, done_last: bool) -> dict[str, np.ndarray]:
    """One trial of ``length`` rows. ``observations[t] = [100 f + 10 n + t, -t, 0.5]``,
    ``actions[t] = [t, 2 t]`` (NaN on the last row), ``rewards[t] = 1000 f + 100 n + t``."""
    t = np.arange(length, dtype=np.float64)
    base = 100 * file_no + 10 * trial
    actions = np.stack([t, 2 * t], axis=1)
    actions[-1] = np.nan
    done = np.zeros(length, bool)
    done[-1] = done_last
    return {
        "time": t * 0.04,
        "observations": np.stack([base + t, -t, np.full(length, 0.5)], axis=1),
        "actions": actions,
        "rewards": 1000 * file_no + 100 * trial + t,
        "done": done,
        "env_infos/time": t * 0.04,
        "env_infos/rwd_dense": -t,
        "env_infos/solved": done.copy(),
        "env_infos/obs_dict/qp": np.stack([base + t, base - t], axis=1),
    }


def write_roboset(path: Path, trials: dict[int, dict[str, np.ndarray]]) -> Path:
    """Write ``Trial<N>`` groups as RoboHive's logger does (nested groups from ``/`` keys, gzip)."""
    with h5py.File(path, "w") as f:
        for number, data in trials.items():
            group = f.create_group(f"Trial{number}")
            for key, value in data.items():
                group.create_dataset(key, data=value, compression="gzip", compression_opts=4)
    return path


def golden_roboset(directory: Path) -> Path:
    """Two files: A holds Trial0 (4 rows, done) and Trial2 (3 rows, horizon); B holds Trial60
    (3 rows, done). So 3 + 2 + 2 = 7 transitions in 3 episodes."""
    directory.mkdir(parents=True, exist_ok=True)
    write_roboset(
        directory / "a_trace.h5",
        {0: roboset_trial(0, 0, 4, done_last=True), 2: roboset_trial(0, 2, 3, done_last=False)},
    )
    write_roboset(directory / "b_trace.h5", {60: roboset_trial(1, 60, 3, done_last=True)})
    return directory


# ----------------------------------------------------------------------------- OGBench


def ogbench_arrays(terminal_rows: list[int], n: int) -> dict[str, np.ndarray]:
    """``observations[i] = [i, 10 i]``, ``actions[i] = [-i]``, ``qpos[i] = [i / 2]``."""
    i = np.arange(n, dtype=np.float32)
    terminals = np.zeros(n, bool)
    terminals[terminal_rows] = True
    return {
        "observations": np.stack([i, 10 * i], axis=1),
        "actions": -i[:, None],
        "terminals": terminals,
        "qpos": (i / 2)[:, None],
        "qvel": np.stack([i, i], axis=1) * 0.25,
    }


def write_ogbench(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    np.savez_compressed(path, **arrays)
    return path


def golden_ogbench(path: Path) -> Path:
    """9 rows; terminals at 3, 4 and 8: trajectories rows 0-3 (3 transitions), row 4 alone (no
    transition, dropped), rows 5-8 (3 transitions)."""
    return write_ogbench(path, ogbench_arrays([3, 4, 8], 9))


# ----------------------------------------------------------------------------- AMAGO


def amago_arrays(
    index: int, length: int, *, terminal: bool, obs_keys: tuple[str, ...] = ("observation",)
) -> dict:
    """One trajectory of ``length`` timesteps (``length - 1`` steps), AMAGO ``FrozenTraj`` layout.

    ``obs[t] = [100 index + t, t]`` per key (plus the key's position), ``actions[t] = [t, -t]``,
    ``rews[t] = index + t / 10``."""
    t = np.arange(length, dtype=np.float32)
    out: dict[str, np.ndarray] = {}
    for j, key in enumerate(obs_keys):
        out[f"_OBS_KEY_{key}"] = np.stack([100 * index + t, t + j], axis=1)
    steps = length - 1
    s = np.arange(steps, dtype=np.float32)
    actions = np.stack([s, -s], axis=1)
    rews = (index + s / 10)[:, None].astype(np.float32)
    dones = np.zeros((steps, 1), bool)
    if terminal and steps:
        dones[-1] = True
    rl2s = np.zeros((length, 3), np.float32)
    rl2s[1:, 0] = rews[:, 0]
    rl2s[1:, 1:] = actions
    out.update(
        rl2s=rl2s,
        time_idxs=np.arange(length, dtype=np.int64)[:, None],
        rews=rews,
        dones=dones,
        actions=actions,
    )
    return out


def write_amago(
    directory: Path, specs: list[tuple[int, bool]], *, compressed: bool = False, **kw: Any
) -> Path:
    """One ``.npz`` per trajectory under ``buffer/fifo`` (AMAGO's file names: env, uuid, time)."""
    fifo = directory / "buffer" / "fifo"
    fifo.mkdir(parents=True, exist_ok=True)
    save = np.savez_compressed if compressed else np.savez
    for i, (length, terminal) in enumerate(specs):
        save(
            fifo / f"toyenv_{i:08x}_{1700000000 + i}.npz", **amago_arrays(i, length, terminal=terminal, **kw)
        )
    return directory


# ----------------------------------------------------------------------------- Minari by hand


def write_minari_by_hand(
    dataset_dir: Path,
    episodes: list[dict[str, Any]],
    *,
    metadata: dict[str, Any] | None = None,
) -> Path:
    """A Minari HDF5 dataset written with h5py (for damaged variants the collector cannot make).

    Each episode dict holds ``observations`` (T+1), ``actions``, ``rewards``, ``terminations``,
    ``truncations`` (T) and optionally ``infos`` (dict of arrays).
    """
    data = dataset_dir / "data"
    data.mkdir(parents=True, exist_ok=True)
    steps = 0
    with h5py.File(data / "main_data.hdf5", "w") as f:
        for i, ep in enumerate(episodes):
            g = f.create_group(f"episode_{i}")
            g.attrs["id"] = i
            g.attrs["total_steps"] = len(ep["rewards"])
            steps += len(ep["rewards"])
            for key, value in ep.items():
                if key == "infos":
                    for k, v in value.items():
                        g.create_dataset(f"infos/{k}", data=v)
                else:
                    g.create_dataset(key, data=value)
    obs_dim = np.asarray(episodes[0]["observations"]).shape[1:] if "observations" in episodes[0] else (1,)
    meta = {
        "dataset_id": "hand/made-v0",
        "total_episodes": len(episodes),
        "total_steps": steps,
        "data_format": "hdf5",
        "minari_version": "0.5.3",
        "observation_space": json.dumps(
            {"type": "Box", "dtype": "float32", "shape": list(obs_dim), "low": [-1.0], "high": [1.0]}
        ),
        "action_space": json.dumps(
            {"type": "Box", "dtype": "float32", "shape": [1], "low": [-1.0], "high": [1.0]}
        ),
        **(metadata or {}),
    }
    (data / "metadata.json").write_text(json.dumps(meta))
    return dataset_dir


def minari_episode(
    t: int, *, terminated: bool = True, obs_dim: int = 2, start: float = 0.0
) -> dict[str, Any]:
    obs = (start + np.arange(t + 1, dtype=np.float32))[:, None] * np.ones(obs_dim, np.float32)
    term = np.zeros(t, bool)
    trunc = np.zeros(t, bool)
    (term if terminated else trunc)[-1] = True
    return {
        "observations": obs,
        "actions": np.arange(t, dtype=np.float32)[:, None],
        "rewards": np.ones(t),
        "terminations": term,
        "truncations": trunc,
    }


def refused(
    result: Any,
    *needles: str,
    hint: bool = False,
    published: tuple[str, ...] = (),
    home: Path | None = None,
) -> str:
    """The tests' refusal check, for a CLI ``result`` (click's ``Result`` or a process's
    ``CompletedProcess``): exit code 1; on stderr an ``error:`` line naming every one of
    ``needles``, then at most one line (exactly one ``hint:`` line with ``hint=True``); no
    traceback and not the CLI's ``unexpected`` catch-all; the cache at ``home`` (default
    ``RLDS_HOME``) holds no dataset but ``published`` and nothing in tmp/. Returns the error line."""
    code = result.exit_code if hasattr(result, "exit_code") else result.returncode
    assert code == 1, (code, result.stderr, getattr(result, "exception", None))
    lines = result.stderr.splitlines()
    assert lines and lines[0].startswith("error: ") and len(lines) <= 2, lines
    assert not hint or (len(lines) == 2 and lines[1].startswith("hint: ")), lines
    assert "Traceback" not in result.stderr and not lines[0].startswith("error: unexpected "), lines
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    home = Path(os.environ["RLDS_HOME"]) if home is None else home
    for sub, kept in (("datasets", sorted(published)), ("tmp", [])):
        folder = home / sub
        left = sorted(p.name for p in folder.iterdir()) if folder.exists() else []
        assert left == kept, (sub, left)
    return lines[0]
