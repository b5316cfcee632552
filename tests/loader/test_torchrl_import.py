"""Importing TorchRL / tensordict memmap directories (``--format torchrl``), with sources written by
TorchRL's and tensordict's own code: ``ReplayBuffer(storage=LazyMemmapStorage(...))`` then
``rb.dumps(path)``, and ``TensorDict.memmap``. Every import is compared with
``TensorDict.load_memmap`` key by key, dtype by dtype.

Covers: partly filled and wrapped (circular) buffers, NaN observations in the continuity check,
vector rewards, ``[B, T]`` storages (time last, and TorchRL's ``ndim=2`` storages, time first),
zero-filled final observations, and clear one-line refusals.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from rlds_cli.cache import open_dataset
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cli.app import app
from rlds_cli.errors import DatasetNotFoundError
from rlds_cli.sources.convert import convert

torch = pytest.importorskip("torch")
tensordict = pytest.importorskip("tensordict")
TensorDict = tensordict.TensorDict

runner = CliRunner()


def _episode(length: int, ep: int, *, done_last: bool = True, reward_dim: int = 1) -> Any:
    """A TED episode: ``observation[t] = [100 ep + t, ep]``, next observation the following one."""
    t = torch.arange(length + 1, dtype=torch.float32)
    obs = torch.stack([100 * ep + t, torch.full_like(t, ep)], dim=-1)
    done = torch.zeros(length, 1, dtype=torch.bool)
    done[-1] = done_last
    return TensorDict(
        {
            "observation": obs[:-1],
            "action": torch.arange(length, dtype=torch.float32)[:, None] + 1000 * ep,
            "episode": torch.full((length,), ep),
            "done": torch.zeros(length, 1, dtype=torch.bool),
            "next": {
                "observation": obs[1:],
                "reward": torch.arange(length * reward_dim, dtype=torch.float32).reshape(length, reward_dim),
                "done": done,
                "terminated": done.clone(),
                "truncated": torch.zeros(length, 1, dtype=torch.bool),
            },
        },
        batch_size=[length],
    )


def _buffer(capacity: int, *episodes: Any, ndim: int = 1) -> Any:
    from torchrl.data import LazyMemmapStorage, ReplayBuffer

    rb = ReplayBuffer(storage=LazyMemmapStorage(capacity, ndim=ndim))
    for ep in episodes:
        rb.extend(ep)
    return rb


def _same_as(ds: Dataset, rows: Any) -> None:
    """The whole dataset equals ``rows`` (a TensorDict in insertion/time order), key by key."""
    batch = ds[:]
    compared = set()
    for key in rows.keys(include_nested=True, leaves_only=True):
        name = "/".join(key) if isinstance(key, tuple) else key
        if name in ("episode", "done", "terminated", "truncated", "next/done", "next/truncated"):
            continue  # recomputed by rlds; ends checked below
        want = rows[key].numpy()
        np.testing.assert_array_equal(batch[name], want, err_msg=name)
        assert batch[name].dtype == want.dtype, name
        compared.add(name)
    assert {"observation", "action", "next/observation", "next/reward", "next/terminated"} <= compared
    source_done = rows["next", "done"].numpy().reshape(-1)
    assert not (source_done & ~batch["next/done"].reshape(-1)).any()  # every source end is an end


def _run(*args: str) -> Any:
    return runner.invoke(app, list(args))


def _one_error_line(result: Any) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    return result.output


# ----------------------------------------------------------------------------- filled rows


@pytest.mark.parametrize("sub", ["", "storage"])
def test_partly_filled_buffer_imports_only_its_filled_rows(tmp_path: Path, sub: str) -> None:
    pytest.importorskip("torchrl")
    rb = _buffer(100, _episode(7, 0))
    rb.dumps(tmp_path / "rb")
    result = _run("download", str(tmp_path / "rb" / sub), "--name", "rb")
    assert result.exit_code == 0, result.output
    ds = open_dataset("rb")
    assert (ds.num_steps, ds.num_episodes) == (7, 1)  # not 100 steps, not a fake 93-step episode
    stored = TensorDict.load_memmap(tmp_path / "rb" / "storage")
    _same_as(ds, stored[:7])
    assert ds.manifest.conversion["inferred_boundaries"] == 0
    assert _run("inspect", "rb", "--check").exit_code == 0


def test_wrapped_buffer_is_read_in_insertion_order(tmp_path: Path) -> None:
    pytest.importorskip("torchrl")
    first, second = _episode(7, 0), _episode(7, 1)
    rb = _buffer(10, first, second)  # 14 writes into 10 rows: writes 0-3 overwritten
    rb.dumps(tmp_path / "rb")
    meta = json.loads((tmp_path / "rb" / "writer" / "metadata.json").read_text())
    assert meta == {"cursor": 4, "write_count": 14}
    convert(tmp_path / "rb", "wrapped")
    ds = open_dataset("wrapped")
    assert list(ds.episodes["length"]) == [3, 7]  # the tail of episode 0, then episode 1
    inserted = torch.cat([first, second])[4:]
    _same_as(ds, inserted)
    stored = TensorDict.load_memmap(tmp_path / "rb" / "storage")
    _same_as(ds, torch.cat([stored[4:], stored[:4]]))
    assert any("insertion order" in n for n in ds.manifest.conversion["notes"])


def test_wrapped_buffer_with_an_unknown_cursor_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("torchrl")
    _buffer(10, _episode(7, 0), _episode(7, 1)).dumps(tmp_path / "rb")
    (tmp_path / "rb" / "writer" / "metadata.json").write_text(json.dumps({"cursor": 1, "write_count": 14}))
    out = _one_error_line(_run("download", str(tmp_path / "rb"), "--name", "w"))
    assert "insertion order is unknown" in out and "write_count 14" in out
    with pytest.raises(DatasetNotFoundError):  # nothing published
        open_dataset("w")


def test_a_buffer_whose_writer_metadata_is_not_json_is_refused_naming_it(tmp_path: Path) -> None:
    pytest.importorskip("torchrl")
    _buffer(10, _episode(7, 0)).dumps(tmp_path / "rb")
    meta = tmp_path / "rb" / "writer" / "metadata.json"
    meta.write_text("{not json")
    out = _one_error_line(_run("download", str(tmp_path / "rb"), "--name", "w"))
    assert f"{meta} is not readable JSON" in out


# ----------------------------------------------------------------------------- values


def test_nan_observations_are_continuous(tmp_path: Path) -> None:
    ep = _episode(7, 0)
    ep["observation"][3, 1] = float("nan")
    ep["next", "observation"][2, 1] = float("nan")
    ep.memmap(tmp_path / "td")
    convert(tmp_path / "td", "nan")
    ds = open_dataset("nan")
    assert (ds.num_episodes, ds.manifest.conversion["inferred_boundaries"]) == (1, 0)
    back = TensorDict.load_memmap(tmp_path / "td")
    np.testing.assert_array_equal(ds[:]["observation"], back["observation"].numpy())  # NaN == NaN here
    assert _run("inspect", "nan", "--check").exit_code == 0


def test_vector_rewards_keep_every_column(tmp_path: Path) -> None:
    _episode(5, 0, reward_dim=3).memmap(tmp_path / "td")
    convert(tmp_path / "td", "vec")
    ds = open_dataset("vec")
    assert ds.manifest.fields["next/reward"].shape == (3,)
    _same_as(ds, TensorDict.load_memmap(tmp_path / "td"))


def test_zero_filled_final_observations_are_not_known(tmp_path: Path) -> None:
    first, second = _episode(4, 0), _episode(3, 1)
    second["next", "observation"][-1] = 0.0  # TorchRL's fill where it does not know the final obs
    torch.cat([first, second]).memmap(tmp_path / "td")
    convert(tmp_path / "td", "zero")
    ds = open_dataset("zero")
    assert ds.episodes["final_known"].tolist() == [True, False]
    assert ds.manifest.conversion["synthesized_final_observations"] == 1
    _same_as(ds, TensorDict.load_memmap(tmp_path / "td"))


def test_one_observation_key_at_zero_is_data_not_a_fill(tmp_path: Path) -> None:
    """A bool flag False at the final step (one key of two all zero) marked a known final
    observation unknown: TorchRL's fill zeroes the whole observation."""
    eps = [_episode(4, 0), _episode(3, 1)]
    for e in eps:
        flag = torch.ones(len(e), 1, dtype=torch.bool)
        e["flag"], e["next", "flag"] = flag, flag.clone()
        e["next", "flag"][-1] = False  # the flag goes down at the last step
    eps[1]["next", "observation"][-1] = 0.0  # and every key at zero: the fill
    torch.cat(eps).memmap(tmp_path / "td")
    convert(tmp_path / "td", "flags")
    assert open_dataset("flags").episodes["final_known"].tolist() == [True, False]


# ----------------------------------------------------------------------------- batched storages


def test_batched_time_last_tensordict(tmp_path: Path) -> None:
    eps = torch.stack([_episode(4, 0), _episode(4, 1, done_last=False)])  # [B=2, T=4]
    eps.memmap(tmp_path / "td")
    convert(tmp_path / "td", "bt")
    ds = open_dataset("bt")
    assert list(ds.episodes["length"]) == [4, 4]
    assert ds[:]["next/truncated"].reshape(-1).tolist() == [False] * 7 + [True]  # a cut stream
    _same_as(ds, TensorDict.load_memmap(tmp_path / "td").reshape(-1))


@pytest.mark.parametrize("capacity", [6, 12])  # full, and half filled
def test_batched_replay_buffer_with_time_first(tmp_path: Path, capacity: int) -> None:
    pytest.importorskip("torchrl")
    eps = torch.stack([_episode(3, 0), _episode(3, 1)])  # [envs=2, T=3]
    rb = _buffer(capacity, eps, ndim=2)  # TorchRL stores ndim=2 data time first: [T, envs]
    rb.dumps(tmp_path / "rb")
    stored = TensorDict.load_memmap(tmp_path / "rb" / "storage")
    assert tuple(stored.batch_size) == (capacity // 2, 2)
    convert(tmp_path / "rb", "tf")
    ds = open_dataset("tf")
    assert list(ds.episodes["length"]) == [3, 3]
    _same_as(ds, stored[:3].transpose(0, 1).reshape(-1))
    _same_as(ds, eps.reshape(-1))


def test_a_partly_filled_ndim2_storage_without_its_writer(tmp_path: Path) -> None:
    """Its ``len`` counts elements: read as dim-0 rows, the unwritten rows became all-zero steps
    (200 steps of which 100 zeros, for a [2, 50] batch in a [500, 2] storage)."""
    pytest.importorskip("torchrl")
    import shutil

    eps = torch.stack([_episode(5, 0), _episode(5, 1)])  # [envs=2, T=5]
    _buffer(40, eps, ndim=2).dumps(tmp_path / "rb")
    shutil.copytree(tmp_path / "rb" / "storage", tmp_path / "alone")
    convert(tmp_path / "alone", "alone")
    ds = open_dataset("alone")
    assert (ds.num_steps, list(ds.episodes["length"])) == (10, [5, 5])
    _same_as(ds, eps.reshape(-1))


@pytest.mark.parametrize("count", [3, 4])
def test_a_partly_filled_ndim1_storage_of_trajectories_without_its_writer(tmp_path: Path, count: int) -> None:
    """An ndim=1 storage of [n, T] trajectories has a [capacity, T] batch shape and counts rows in
    len: read as elements, 4 trajectories became 4 one-step episodes (3 were refused)."""
    pytest.importorskip("torchrl")
    import shutil

    eps = torch.stack([_episode(4, i) for i in range(count)])  # [n, T=4]
    _buffer(10, eps).dumps(tmp_path / "rb")
    shutil.copytree(tmp_path / "rb" / "storage", tmp_path / "alone")
    convert(tmp_path / "alone", "alone")
    ds = open_dataset("alone")
    assert list(ds.episodes["length"]) == [4] * count
    _same_as(ds, eps.reshape(-1))


def test_a_collectors_bookkeeping_is_dropped(tmp_path: Path) -> None:
    """``collector/traj_ids`` was kept as a step column: they restart in every dump, and TorchRL's
    SliceSampler took them for the trajectories of a merge of two dumps (slices crossing)."""
    pytest.importorskip("torchrl")
    ep = _episode(6, 0)
    ep["collector"] = TensorDict({"traj_ids": torch.zeros(6, dtype=torch.int64),
                                  "mask": torch.ones(6, dtype=torch.bool)}, batch_size=[6])  # fmt: skip
    _buffer(6, ep).dumps(tmp_path / "rb")
    convert(tmp_path / "rb", "col")
    assert not [k for k in open_dataset("col").fields if k.startswith("collector")]


def test_three_batch_dims_are_refused(tmp_path: Path) -> None:
    torch.stack([torch.stack([_episode(2, 0)])]).memmap(tmp_path / "td")
    out = _one_error_line(_run("download", str(tmp_path / "td"), "--name", "x", "--format", "torchrl"))
    assert "batch shape [1, 1, 2]" in out


def test_dump_and_its_storage_are_the_same_source(tmp_path: Path) -> None:
    pytest.importorskip("torchrl")
    _buffer(10, _episode(7, 0), _episode(7, 1)).dumps(tmp_path / "rb")
    first = convert(tmp_path / "rb", "same")
    assert convert(tmp_path / "rb" / "storage", "same").reused  # the writer's cursor is hashed too
    assert any(f["path"] == "writer/metadata.json" for f in first.manifest.source["files"])
