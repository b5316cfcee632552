"""AMAGO trajectory folders: golden values, Dict observations, pickled ``.traj`` refusal and
opt-in, parallel determinism, bad files."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlds_cli.cache import open_dataset
from rlds_cli.errors import SourceError, SourceFormatError
from rlds_cli.sources.convert import convert
from tests.formats_fixtures import amago_arrays, write_amago


def test_golden_values(tmp_path: Path) -> None:
    d = write_amago(tmp_path / "run", [(4, True), (3, False), (1, False)])
    m = convert(d, "am").manifest
    ds = open_dataset("am")
    assert m.source["format"] == "amago"
    assert (ds.num_steps, ds.num_episodes) == (5, 2)
    assert m.conversion["dropped_episodes"] == 1  # a one-timestep trajectory has no transition
    b = ds[:]
    assert b["observation"][:, 0].tolist() == [0, 1, 2, 100, 101]
    assert b["next/observation"][:, 0].tolist() == [1, 2, 3, 101, 102]
    assert b["action"].tolist() == [[0, 0], [1, -1], [2, -2], [0, 0], [1, -1]]
    assert b["next/reward"][:, 0].tolist() == pytest.approx([0, 0.1, 0.2, 1, 1.1])
    assert b["next/terminated"][:, 0].tolist() == [0, 0, 1, 0, 0]
    assert b["next/truncated"][:, 0].tolist() == [0, 0, 0, 0, 1]  # AMAGO records no truncation
    assert b["time_idx"][:, 0].tolist() == [0, 1, 2, 0, 1]
    assert "rl2s" not in ds.fields
    assert ds.episodes["source_id"].tolist() == [0, 1]
    assert len(m.source["files"]) == 3
    assert m.source["files"][0]["path"] == "toyenv_00000000_1700000000.npz"


def test_dict_observations_and_compressed(tmp_path: Path) -> None:
    d = write_amago(tmp_path / "run", [(3, True)], compressed=True, obs_keys=("image", "proprio"))
    convert(d, "dict")
    ds = open_dataset("dict")
    assert set(ds.stored_fields) >= {"observation/image", "observation/proprio"}
    assert ds[:]["next/observation/proprio"][:, 1].tolist() == [2, 3]


def test_workers_byte_identical(tmp_path: Path) -> None:
    d = write_amago(tmp_path / "run", [(3 + i % 4, i % 3 == 0) for i in range(12)])
    a = convert(d, "w1", options={"workers": 1})
    b = convert(d, "w2", options={"workers": 2})
    for p in sorted(a.path.rglob("*.npy")):
        assert p.read_bytes() == (b.path / p.relative_to(a.path)).read_bytes()


@dataclass
class Timestep:
    """Stands in for ``amago.hindsight.Timestep`` (same attributes, batch dimension 1)."""

    obs: dict[str, np.ndarray]
    prev_action: np.ndarray
    reward: float
    time_idx: int
    terminal: bool


@dataclass
class Trajectory:
    timesteps: list[Timestep]


def _traj(length: int) -> Trajectory:
    arrays = amago_arrays(0, length, terminal=True)
    steps = [Timestep({"observation": arrays["_OBS_KEY_observation"][:1]}, np.zeros((1, 2)), 0.0, 0, False)]
    for t in range(1, length):
        steps.append(
            Timestep(
                {"observation": arrays["_OBS_KEY_observation"][t : t + 1]},
                arrays["actions"][t - 1 : t],
                float(arrays["rews"][t - 1, 0]),
                t,
                bool(arrays["dones"][t - 1, 0]),
            )
        )
    return Trajectory(steps)


def test_traj_refused_unless_allowed(tmp_path: Path) -> None:
    d = tmp_path / "buffer"
    d.mkdir()
    with open(d / "env_1234abcd_1700000000.0.traj", "wb") as fh:
        pickle.dump(_traj(4), fh)
    with pytest.raises(SourceError, match=r"\.traj file .*unpickling runs arbitrary code") as info:
        convert(d, "bad")
    assert "--allow-pickle" in info.value.hint
    convert(d, "ok", options={"allow_pickle": True})
    write_amago(tmp_path / "npz", [(4, True)])
    b = open_dataset("ok")[:]
    want = open_dataset(convert(tmp_path / "npz", "ref").manifest.name)[:]
    for key in ("observation", "next/observation", "action", "next/reward", "next/terminated", "time_idx"):
        assert np.array_equal(b[key], want[key].astype(b[key].dtype)), key


def test_bad_files(tmp_path: Path) -> None:
    def one(name: str, arrays: dict[str, Any]) -> Path:
        d = tmp_path / name
        d.mkdir()
        np.savez(d / "t.npz", **arrays)
        return d

    good = amago_arrays(0, 4, terminal=True)
    with pytest.raises(SourceFormatError, match=r"t.npz has no 'rews' array"):
        convert(one("missing", {k: v for k, v in good.items() if k != "rews"}), "bad", format="amago")
    with pytest.raises(SourceFormatError, match=r"unknown arrays \['extra'\]"):
        convert(one("unknown", {**good, "extra": np.zeros(3)}), "bad")
    with pytest.raises(SourceFormatError, match=r"'dones' has 2 rows, 'actions' has 3"):
        convert(one("ragged", {**good, "dones": good["dones"][:2]}), "bad")
    with pytest.raises(SourceFormatError, match=r"'observation' has 3 rows, expected 4"):
        convert(one("short", {**good, "_OBS_KEY_observation": good["_OBS_KEY_observation"][:3]}), "bad")
    d = write_amago(tmp_path / "mixed", [(3, True), (3, True)])
    f = sorted(d.rglob("*.npz"))[1]
    np.savez(f, **{**good, "_OBS_KEY_observation": np.zeros((4, 7), np.float32)})
    with pytest.raises(SourceFormatError, match=r"mixed shapes across episodes"):
        convert(d, "bad")
    f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(SourceFormatError, match=r"truncated or corrupt"):
        convert(d, "bad", format="amago")
