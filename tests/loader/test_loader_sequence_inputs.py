"""Sequence-model inputs: previous action and reward (``rl2s``) and the time index against hand
statements, against AMAGO's own trajectory files, and the AMAGO export round trip."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.opening import open_dataset
from rlds_cli.errors import ExportError
from rlds_cli.export import export_dataset
from rlds_cli.loader import Loader
from rlds_cli.loader.windows import PrevActionReward
from rlds_cli.sources.convert import convert
from tests.formats_fixtures import amago_arrays, write_amago
from tests.loader_fixtures import TedFactory, resumed_batches

LENGTHS = [4, 1, 6, 3]


@pytest.fixture(scope="module")
def ds(ted_dataset: TedFactory) -> Dataset:
    return ted_dataset(LENGTHS, "seq")


def test_against_hand_statement(ds: Dataset) -> None:
    # step i: action = [0.1 i, -i], reward = i; episode starts 0, 4, 5, 11
    loader = Loader(ds, ds.num_steps, sampler="epoch", shuffle=False, transform=PrevActionReward())
    b = next(iter(loader))
    starts = {0, 4, 5, 11}
    for i in range(ds.num_steps):
        start = max(s for s in starts if s <= i)
        prev = [0.0, 0.0] if i == start else [0.1 * (i - 1), -(i - 1.0)]
        reward = 0.0 if i == start else float(i - 1)
        assert b["prev_action"][i].tolist() == pytest.approx(prev)
        assert b["prev_reward"][i].tolist() == [reward]
        assert b["rl2s"][i].tolist() == pytest.approx([reward, *prev])
        assert int(b["time_idx"][i]) == i - start


def test_slices_prefetch_resume(ds: Dataset) -> None:
    def make(seed: int) -> Loader:
        return Loader(ds, 6, sampler="slice", slice_len=3, seed=seed, epochs=None, prefetch=2,
                      transform=PrevActionReward())  # fmt: skip

    want, got = resumed_batches(make, skip=1, take=3, seeds=(0, 4))
    for w, g in zip(want, got, strict=True):
        assert g["rl2s"].shape == (2, 3, 3)
        assert g["rl2s"].tolist() == w["rl2s"].tolist() and g["time_idx"].tolist() == w["time_idx"].tolist()


def test_matches_amago_files(tmp_path: Path) -> None:
    specs = [(5, True), (3, False), (4, True)]
    d = write_amago(tmp_path / "run", specs)
    convert(d, "am", root=tmp_path / "cache")
    ds = open_dataset("am", tmp_path / "cache")
    b = next(iter(Loader(ds, ds.num_steps, sampler="epoch", shuffle=False, transform=PrevActionReward())))
    # AMAGO's own rl2s and time_idxs at the timesteps that are steps (all but the last)
    files = [amago_arrays(i, n, terminal=t) for i, (n, t) in enumerate(specs)]
    want_rl2s = np.concatenate([f["rl2s"][:-1] for f in files])
    want_time = np.concatenate([f["time_idxs"][:-1, 0] for f in files])
    assert b["rl2s"].numpy() == pytest.approx(want_rl2s)
    assert b["time_idx"].tolist() == want_time.tolist()


def test_export_round_trips(tmp_path: Path, ds: Dataset) -> None:
    out = export_dataset(ds, tmp_path / "amago", "amago")
    files = sorted((out / "buffer" / "fifo").glob("*.npz"))
    assert len(files) == len(LENGTHS)
    convert(out, "back", root=tmp_path / "cache")
    back = open_dataset("back", tmp_path / "cache")
    a, b = ds[:], back[:]
    for key in ("observation", "next/observation", "action", "next/reward", "next/terminated"):
        assert b[key].tolist() == a[key].tolist(), key
    assert b["time_idx"][:, 0].tolist() == [0, 1, 2, 3, 0, 0, 1, 2, 3, 4, 5, 0, 1, 2]
    # the rl2s written is the one PrevActionReward builds at sample time
    rl2s = np.concatenate([np.load(f)["rl2s"][:-1] for f in files])
    batch = next(iter(Loader(ds, ds.num_steps, sampler="epoch", shuffle=False, transform=PrevActionReward())))
    assert rl2s.tolist() == batch["rl2s"].tolist()
    # exporting the export (time_idx now stored) writes the same files
    again = export_dataset(back, tmp_path / "amago2", "amago")
    for f, g in zip(files, sorted((again / "buffer" / "fifo").glob("*.npz")), strict=True):
        x, y = np.load(f), np.load(g)
        assert sorted(x) == sorted(y) and all(np.array_equal(x[k], y[k]) for k in x)
    with pytest.raises(ExportError, match="already exists"):
        export_dataset(ds, out, "amago")


def test_unbound() -> None:
    with pytest.raises(RuntimeError, match="bound"):
        PrevActionReward()({"index": np.arange(2)})


def test_export_needs_an_observation(tmp_path: Path) -> None:
    from rlds_cli.cache.builder import DatasetBuilder
    from rlds_cli.formats.base import StepBlock

    with DatasetBuilder("noobs", root=tmp_path, backend="memmap") as builder:
        builder.append(StepBlock(
            steps={"action": np.zeros((3, 1), np.float32), "next/reward": np.zeros((3, 1), np.float32),
                   "next/terminated": np.zeros((3, 1), bool),
                   "next/truncated": np.array([[False], [False], [True]])},
            observations={"state": np.zeros((4, 2), np.float32)},
            ends=np.array([2]),
        ))  # fmt: skip
        builder.commit(source={"generator": "test"})
    with pytest.raises(ExportError, match="no observation key to export to AMAGO"):
        export_dataset(open_dataset("noobs", tmp_path), tmp_path / "out", "amago")
    assert not (tmp_path / "out").exists()
