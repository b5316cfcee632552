"""The cache contract, checked the same way for both storage backends.

Everything here is written out literally: the golden 3-episode D4RL file
(:func:`tests.d4rl_fixtures.golden_three_episodes`) converted with and without
``next_observations``, then every TED column, the episode index, the manifest and the on-disk
layout compared with the values the D4RL rules give by hand.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlds_cli.cache import CacheRoot, Dataset, TedBatch, open_dataset, validate_name
from rlds_cli.cache.backends import NPY_HEADER_BYTES
from rlds_cli.cache.manifest import FORMAT_VERSION, PLAIN_FORMAT_VERSION
from rlds_cli.errors import (
    CorruptDatasetError,
    DatasetNotFoundError,
    InvalidNameError,
)
from rlds_cli.sources.convert import convert
from tests.d4rl_fixtures import (
    GOLDEN_KEYS,
    GOLDEN_STORED_FIELDS,
    GOLDEN_TED_FIELDS,
    GoldenFactory,
    golden_column,
    golden_expected,
    golden_three_episodes,
    write_d4rl,
)
from tests.dataset_fixtures import rewrite_manifest

BACKENDS = ("memmap", "zarr")


def _stored_paths(ds: Dataset) -> list[Path]:
    return sorted(p for p in (ds.directory / "arrays").rglob("*") if p.is_file())


def _assert_batches_equal(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        x, y = np.asarray(a[key]), np.asarray(b[key])
        assert x.dtype == y.dtype, key
        assert x.shape == y.shape, key
        np.testing.assert_array_equal(x, y, err_msg=key)


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(autouse=True)
def _zarr_columns_on_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every zarr column read through its chunks, however small (by default a small column is
    read whole into RAM at open, and these datasets are all small): the chunk reader, its
    layouts and its damage checks are what these tests are about. The in-RAM columns are
    checked against the chunk reader in ``tests/cache/test_zarr_read_layout.py``."""
    from rlds_cli.cache.backends.zarr import write as zarr_write

    monkeypatch.setattr(zarr_write, "ZARR_IN_RAM_BYTES", 0)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=[False, True], ids=["no_next", "with_next"])
def with_next(request: pytest.FixtureRequest) -> bool:
    return request.param


@pytest.fixture
def golden(golden_dataset: GoldenFactory, backend: str, with_next: bool) -> Dataset:
    return golden_dataset("golden/three-v0", with_next=with_next, backend=backend)


# ----------------------------------------------------------------------------- columns


@pytest.mark.parametrize("key", GOLDEN_KEYS)
def test_every_ted_column_matches_the_golden_values(golden: Dataset, with_next: bool, key: str) -> None:
    expected = golden_column(with_next, key)
    got = golden.gather(np.arange(golden.num_steps))[key]
    assert isinstance(got, np.ndarray)
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
    # slicing the dataset gives the same column
    np.testing.assert_array_equal(golden[:][key], expected)


def test_full_read_has_exactly_the_ted_keys(golden: Dataset) -> None:
    batch = golden[:]
    assert isinstance(batch, TedBatch)
    assert sorted(batch) == sorted(GOLDEN_KEYS)
    assert golden.fields == GOLDEN_TED_FIELDS
    assert list(golden.fields) == [
        "action",
        "episode",
        "info/qpos",
        "observation",
        "next/done",
        "next/observation",
        "next/reward",
        "next/terminated",
        "next/truncated",
    ]


def test_episode_index(golden: Dataset, with_next: bool) -> None:
    exp = golden_expected(with_next)
    index = golden.episode_index
    assert index.dtype.names == ("start", "length", "source_id", "final_known")
    assert index["start"].tolist() == exp["start"]
    assert index["length"].tolist() == exp["length"]
    assert index["source_id"].tolist() == exp["source_id"]
    assert index["final_known"].tolist() == exp["final_known"]
    # episodes.npy on disk is the same structured array
    on_disk = np.load(golden.directory / "episodes.npy", allow_pickle=False)
    assert on_disk.tolist() == index.tolist()


def test_manifest_counts_and_fields(golden: Dataset, backend: str, with_next: bool) -> None:
    exp = golden_expected(with_next)
    m = golden.manifest
    assert (m.num_steps, m.num_episodes) == (exp["num_steps"], exp["num_episodes"])
    assert (golden.num_steps, golden.num_episodes, len(golden)) == (
        exp["num_steps"],
        exp["num_episodes"],
        exp["num_steps"],
    )
    assert m.name == "golden/three-v0"
    assert m.backend == backend
    # plain arrays only: version 1, which rlds before frame columns (version 2) reads too
    assert m.format_version == PLAIN_FORMAT_VERSION == 1 and FORMAT_VERSION == 2
    assert m.layout == "flat-ted"
    assert m.lineage == []
    assert m.created_by.startswith("rlds-cli ")
    assert {k: spec.to_dict() for k, spec in m.fields.items()} == GOLDEN_STORED_FIELDS
    assert m.conversion == exp["conversion"]
    assert m.source["format"] == "d4rl"
    assert m.source["options"] == {}
    assert m.source["metadata"] == {"metadata/algorithm": "SAC", "metadata/iteration": 3}
    # the JSON on disk says the same, with the format marker
    raw = json.loads((golden.directory / "manifest.json").read_text())
    assert raw["format"] == "rlds-ted"
    assert raw["format_version"] == 1
    assert raw["num_steps"] == exp["num_steps"]
    assert raw["num_episodes"] == exp["num_episodes"]
    assert raw["fields"] == GOLDEN_STORED_FIELDS
    assert CacheRoot().manifest("golden/three-v0").to_dict() == m.to_dict()


# ----------------------------------------------------------------------------- reading


def test_episode_equals_gather_of_its_indices(golden: Dataset, with_next: bool) -> None:
    exp = golden_expected(with_next)
    for i, (start, length) in enumerate(zip(exp["start"], exp["length"], strict=True)):
        by_episode = golden.episode(i)
        by_gather = golden.gather(np.arange(start, start + length))
        _assert_batches_equal(by_episode, by_gather)
        assert by_episode["episode"].tolist() == [i] * length
        # negative episode numbers count from the end
        _assert_batches_equal(golden.episode(i - exp["num_episodes"]), by_gather)
        # a key selection gives just those keys, same values
        sel = golden.episode(i, keys=["next/observation", ("next", "done")])
        assert sorted(sel) == ["next/done", "next/observation"]
        np.testing.assert_array_equal(sel["next/observation"], by_gather["next/observation"])


def test_episode_out_of_range(golden: Dataset) -> None:
    with pytest.raises(IndexError):
        golden.episode(3)
    with pytest.raises(IndexError):
        golden.episode(-4)


def test_gather_any_index_shape(golden: Dataset, with_next: bool) -> None:
    idx = np.array([[0, 5], [2, 2], [1, 3]])
    batch = golden.gather(idx)
    for key in GOLDEN_KEYS:
        full = golden_column(with_next, key)
        assert batch[key].shape == (3, 2, *full.shape[1:]), key
        np.testing.assert_array_equal(batch[key], full[idx], err_msg=key)
    # 3-D index, a list, a scalar, and an empty index
    idx3 = np.arange(4).reshape(2, 1, 2)
    np.testing.assert_array_equal(
        golden.gather(idx3)["observation"], golden_column(with_next, "observation")[idx3]
    )
    np.testing.assert_array_equal(golden.gather([4, 1])["action"], golden_column(with_next, "action")[[4, 1]])
    scalar = golden.gather(2)
    assert scalar["next/observation"].shape == (2,)
    np.testing.assert_array_equal(scalar["next/observation"], golden_column(with_next, "next/observation")[2])
    assert scalar["episode"].shape == ()
    assert int(scalar["episode"]) == 0
    empty = golden.gather(np.zeros((0,), np.int64))
    for key in GOLDEN_KEYS:
        assert empty[key].shape == (0, *golden_column(with_next, key).shape[1:]), key
    # unsigned and narrow integer dtypes work too
    np.testing.assert_array_equal(
        golden.gather(np.array([3, 0], np.uint8))["next/reward"],
        golden_column(with_next, "next/reward")[[3, 0]],
    )


def test_gather_negative_indices_count_from_the_end(golden: Dataset, with_next: bool) -> None:
    n = golden.num_steps
    batch = golden.gather([-1, -n, -2])
    for key in GOLDEN_KEYS:
        full = golden_column(with_next, key)
        np.testing.assert_array_equal(batch[key], full[[n - 1, 0, n - 2]], err_msg=key)
    np.testing.assert_array_equal(golden[-1]["episode"], 2)


@pytest.mark.parametrize("bad", ["n", "-n-1", "n+100", "mixed"])
def test_gather_out_of_range_raises_index_error(golden: Dataset, bad: str) -> None:
    n = golden.num_steps
    index = {"n": [n], "-n-1": [-n - 1], "n+100": [[0, n + 100]], "mixed": [0, 1, n]}[bad]
    with pytest.raises(IndexError):
        golden.gather(index)


def test_gather_unknown_key_raises_key_error(golden: Dataset) -> None:
    with pytest.raises(KeyError, match="nope"):
        golden.gather([0], keys=["action", "nope"])
    with pytest.raises(KeyError):
        golden.gather([0], keys=[("next", "nope")])
    with pytest.raises(KeyError):
        golden.episode(0, keys=["next/action"])
    with pytest.raises(KeyError):
        golden.column("next/observation")  # derived, never stored


def test_keys_selection_reads_only_the_named_keys(golden: Dataset, backend: str, with_next: bool) -> None:
    # Remove the arrays of two keys that are not asked for: a selection that touches only the
    # named keys still reads fine, a full read fails loudly.
    arrays = golden.directory / "arrays"
    for key in ("info/qpos", "next/truncated"):
        target = arrays / (f"{key}.npy" if backend == "memmap" else key)
        assert target.exists()
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink()
    ds = open_dataset("golden/three-v0")
    batch = ds.gather([0, 3], keys=["observation", ("next", "observation"), "next/reward", "episode"])
    assert list(batch) == ["observation", "next/observation", "next/reward", "episode"]
    for key in batch:
        np.testing.assert_array_equal(batch[key], golden_column(with_next, key)[[0, 3]], err_msg=key)
    assert sorted(ds.episode(1, keys=["action"])) == ["action"]
    with pytest.raises(CorruptDatasetError):
        ds.gather([0])
    with pytest.raises(CorruptDatasetError):
        ds.gather([0], keys=["next/done"])  # next/done needs next/truncated


def test_ted_batch_tuple_keys(golden: Dataset, with_next: bool) -> None:
    batch = golden.gather([1, 2])
    assert batch["next", "reward"] is batch["next/reward"]
    assert ("next", "reward") in batch
    assert "next/reward" in batch
    assert ("next", "nope") not in batch
    assert batch.get(("next", "observation")) is batch["next/observation"]
    assert batch.get(("next", "nope"), 7) == 7
    assert batch.batch_size == 2
    nested = batch.nested()
    assert sorted(nested) == ["action", "episode", "info", "next", "observation"]
    assert sorted(nested["next"]) == ["done", "observation", "reward", "terminated", "truncated"]
    assert nested["info"]["qpos"] is batch["info/qpos"]
    np.testing.assert_array_equal(nested["next"]["reward"], golden_column(with_next, "next/reward")[[1, 2]])
    copy = batch.to_numpy()
    assert isinstance(copy, TedBatch)
    _assert_batches_equal(copy, batch)
    assert not any(isinstance(v, np.memmap) for v in copy.values())
    with pytest.raises(KeyError):
        batch["next", "nope"]


def test_dataset_pickles_by_path(golden: Dataset, with_next: bool) -> None:
    before = golden[:]  # opens every column first: open memory maps must not travel
    data = pickle.dumps(golden)
    assert len(data) < 8192
    assert str(golden.directory).encode() in data
    clone = pickle.loads(data)
    assert isinstance(clone, Dataset)
    assert clone.directory == golden.directory
    assert clone.manifest.to_dict() == golden.manifest.to_dict()
    _assert_batches_equal(clone[:], before)
    assert clone.episode_index.tolist() == golden.episode_index.tolist()
    # and once more through a fresh (never read) dataset
    fresh = pickle.loads(pickle.dumps(open_dataset("golden/three-v0")))
    _assert_batches_equal(fresh.gather([0, 1]), golden.gather([0, 1]))


def test_repr_names_the_dataset(golden: Dataset, backend: str, with_next: bool) -> None:
    n = golden_expected(with_next)["num_steps"]
    assert repr(golden) == f"Dataset(name='golden/three-v0', steps={n}, episodes=3, backend='{backend}')"


# ----------------------------------------------------------------------------- on-disk layout


@pytest.mark.parametrize("with_next", [False, True], ids=["no_next", "with_next"])
def test_memmap_arrays_open_with_plain_numpy(tmp_path: Path, with_next: bool) -> None:
    source = golden_three_episodes(tmp_path / "golden.hdf5", with_next=with_next)
    convert(source, "plain", backend="memmap")
    ds = open_dataset("plain")
    exp = golden_expected(with_next)
    n, e = exp["num_steps"], exp["num_episodes"]
    arrays = ds.directory / "arrays"
    assert sorted(p.relative_to(arrays).as_posix() for p in _stored_paths(ds)) == [
        "action.npy",
        "info/qpos.npy",
        "next/reward.npy",
        "next/terminated.npy",
        "next/truncated.npy",
        "observation.npy",
    ]
    expected_plain = {
        "observation.npy": np.asarray(exp["flat_observation"], np.float32),
        "action.npy": golden_column(with_next, "action"),
        "next/reward.npy": golden_column(with_next, "next/reward"),
        "next/terminated.npy": golden_column(with_next, "next/terminated"),
        "next/truncated.npy": golden_column(with_next, "next/truncated"),
        "info/qpos.npy": golden_column(with_next, "info/qpos"),
    }
    for rel, expected in expected_plain.items():
        arr = np.load(arrays / rel, mmap_mode="r")
        assert isinstance(arr, np.memmap), rel
        assert arr.dtype == expected.dtype, rel
        assert arr.shape == expected.shape, rel
        np.testing.assert_array_equal(arr, expected, err_msg=rel)
        assert arr.flags.c_contiguous
        # a plain load (no mmap) agrees
        np.testing.assert_array_equal(np.load(arrays / rel), expected, err_msg=rel)
    assert np.load(arrays / "observation.npy", mmap_mode="r").shape == (n + e, 2)
    # the dataset's own columns are those read-only memory maps
    col = ds.column("observation")
    assert isinstance(col, np.memmap)
    assert not col.flags.writeable
    # the header is padded to NPY_HEADER_BYTES, so the data is aligned
    assert (arrays / "action.npy").stat().st_size == NPY_HEADER_BYTES + n * 4


def test_zarr_stores_the_same_flat_arrays(tmp_path: Path, with_next: bool) -> None:
    import zarr

    source = golden_three_episodes(tmp_path / "golden.hdf5", with_next=with_next)
    convert(source, "z", backend="zarr")
    ds = open_dataset("z")
    exp = golden_expected(with_next)
    group = zarr.open_group(str(ds.directory / "arrays"), mode="r")
    obs = group["observation"]
    assert obs.shape == (exp["num_steps"] + exp["num_episodes"], 2)
    np.testing.assert_array_equal(obs[...], np.asarray(exp["flat_observation"], np.float32))
    assert group["next/reward"].shape == (exp["num_steps"], 1)
    assert "next/observation" not in group
    assert "next/done" not in group
    assert "episode" not in group


def _ramp_file(path: Path, *, episodes: int, length: int, obs_dim: int) -> Path:
    rng = np.random.default_rng(0)
    n = episodes * length
    timeouts = np.zeros(n, bool)
    timeouts[length - 1 :: length] = True
    return write_d4rl(
        path,
        observations=rng.standard_normal((n, obs_dim)).astype(np.float32),
        actions=rng.standard_normal((n, 3)).astype(np.float32),
        rewards=rng.standard_normal(n).astype(np.float32),
        terminals=np.zeros(n, bool),
        timeouts=timeouts,
        next_observations=rng.standard_normal((n, obs_dim)).astype(np.float32),
    )


def test_flat_layout_stores_observations_once(tmp_path: Path) -> None:
    # 10 episodes of 100 steps, 17-dim observations, next_observations everywhere different
    # from the following row: they all end up as inferred episode ends except the flagged ones,
    # so use continuous next_observations to get exactly 10 episodes.
    n_ep, length, dim = 10, 100, 17
    path = tmp_path / "ramp.hdf5"
    _ramp_file(path, episodes=n_ep, length=length, obs_dim=dim)
    import h5py

    with h5py.File(path, "r+") as f:
        obs = f["observations"][()]
        nxt = np.concatenate([obs[1:], obs[-1:] + 1])
        for end in range(length - 1, n_ep * length, length):
            nxt[end] = obs[end] + 1000
        f["next_observations"][...] = nxt
    convert(path, "flat", backend="memmap")
    ds = open_dataset("flat")
    n = n_ep * length
    assert (ds.num_steps, ds.num_episodes) == (n, n_ep)
    assert ds.manifest.conversion["inferred_boundaries"] == 0
    stored = ds.directory / "arrays" / "observation.npy"
    row = dim * 4
    assert stored.stat().st_size == NPY_HEADER_BYTES + (n + n_ep) * row
    assert not (ds.directory / "arrays" / "next" / "observation.npy").exists()
    root_plus_next = 2 * n * row
    assert stored.stat().st_size / root_plus_next == pytest.approx(0.5, abs=0.02)
    # and both views read back exactly from that one array
    np.testing.assert_array_equal(ds[:]["observation"], obs)
    np.testing.assert_array_equal(ds[:]["next/observation"], nxt)


def test_backends_give_identical_values(tmp_path: Path, with_next: bool) -> None:
    source = golden_three_episodes(tmp_path / "golden.hdf5", with_next=with_next)
    convert(source, "m", backend="memmap")
    convert(source, "z", backend="zarr")
    m, z = open_dataset("m"), open_dataset("z")
    assert m.manifest.backend == "memmap"
    assert z.manifest.backend == "zarr"
    _assert_batches_equal(m[:], z[:])
    idx = np.array([[4, 0], [-1, 2]])
    _assert_batches_equal(m.gather(idx), z.gather(idx))
    for i in range(3):
        _assert_batches_equal(m.episode(i), z.episode(i))
    assert m.episode_index.tolist() == z.episode_index.tolist()
    assert {k: s.to_dict() for k, s in m.stored_fields.items()} == {
        k: s.to_dict() for k, s in z.stored_fields.items()
    }


def test_backends_identical_on_a_bigger_file(tmp_path: Path) -> None:
    # enough rows for several zarr chunks of the 4-byte columns (131072 rows each)
    path = _ramp_file(tmp_path / "big.hdf5", episodes=300, length=1000, obs_dim=2)
    convert(path, "m", backend="memmap")
    convert(path, "z", backend="zarr")
    m, z = open_dataset("m"), open_dataset("z")
    assert m.num_steps == z.num_steps == 300 * 1000
    rng = np.random.default_rng(1)
    idx = rng.integers(-m.num_steps, m.num_steps, size=(64, 8))
    _assert_batches_equal(m.gather(idx), z.gather(idx))
    _assert_batches_equal(m.episode(123), z.episode(123))
    _assert_batches_equal(m.episode(-1), z.episode(-1))


# ----------------------------------------------------------------------------- zarr layouts

#: Chunk and shard sizes small enough that 7 short episodes span many chunks and shards: the
#: (3, 4, 4) uint8 frames are one row a chunk (the pixel path), the rest several rows a chunk.
ZARR_LAYOUTS = {
    "sharded": {"ZARR_CHUNK_BYTES": 40, "ZARR_SHARD_BYTES": 160},
    # as rlds wrote zarr before sharding: one file per chunk (read by the same chunk reader)
    "one-file-per-chunk": {"ZARR_CHUNK_BYTES": 40, "ZARR_SHARD_BYTES": 0},
}


def _pixel_blocks(lengths: tuple[int, ...], seed: int = 7) -> list[Any]:
    """Episodes with one-row chunks (``pixels``: 48 bytes a row) and multi-row chunks (the rest)."""
    from rlds_cli.formats.base import StepBlock

    rng = np.random.default_rng(seed)
    blocks = []
    for n in lengths:
        flags = np.zeros((n, 1), bool)
        flags[-1] = True
        blocks.append(
            StepBlock(
                steps={
                    "action": rng.integers(0, 9, (n, 1)).astype(np.int64),
                    "next/reward": rng.standard_normal((n, 1)).astype(np.float32),
                    "next/terminated": flags & (rng.random((n, 1)) < 0.5),
                    "next/truncated": flags,
                },
                observations={
                    "pixels": rng.integers(0, 256, (n + 1, 3, 4, 4), dtype=np.uint8),
                    "state": rng.standard_normal((n + 1, 2)).astype(np.float32),
                },
                ends=np.array([n - 1]),
            )
        )
    return blocks


@pytest.fixture(params=list(ZARR_LAYOUTS))
def zarr_pair(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> tuple[Dataset, Dataset]:
    """The same 7 episodes written with memmap and with zarr in the layout of the param."""
    from rlds_cli.cache import DatasetBuilder
    from rlds_cli.cache.backends.zarr import write as backends

    for name, value in ZARR_LAYOUTS[request.param].items():
        monkeypatch.setattr(backends, name, value)
    blocks = _pixel_blocks((13, 1, 29, 5, 17, 2, 24))
    for backend in BACKENDS:
        with DatasetBuilder(backend, backend=backend) as builder:
            for block in blocks:
                builder.append(block)
            builder.commit()
    return open_dataset("memmap"), open_dataset("zarr")


def test_zarr_layout_has_many_chunks_and_shards(zarr_pair: tuple[Dataset, Dataset]) -> None:
    z = zarr_pair[1]
    pixels = z.column("pixels")
    reader = pixels._reader
    assert reader is not None, "the layouts rlds writes are read by its own chunk reader"
    assert reader.chunk_rows == 1
    files = [p for p in (z.directory / "arrays" / "pixels" / "c").rglob("*") if p.is_file()]
    if reader.per_shard:
        assert reader.per_shard == 3 and len(files) == -(-len(pixels) // 3)
    else:
        assert len(files) == len(pixels)
    assert z.column("state")._reader.chunk_rows == 5


def test_zarr_gather_matches_memmap_at_chunk_edges_duplicates_and_negatives(
    zarr_pair: tuple[Dataset, Dataset],
) -> None:
    m, z = zarr_pair
    n = m.num_steps
    edges = [0, 1, 2, 3, 4, 5, 9, 10, 11, 19, 20, 21, 39, 40, 41, n - 2, n - 1]
    cases = [
        np.array(edges),
        np.array(edges[::-1]),  # unsorted
        np.array([5, 5, 5, 0, 5, n - 1, n - 1]),  # duplicates
        np.array([-1, -2, -n, 3, -n + 3]),  # negative: from the end
        np.random.default_rng(3).integers(-n, n, size=(16, 5)),  # any shape
        np.array([7]),
    ]
    for idx in cases:
        _assert_batches_equal(m.gather(idx), z.gather(idx))
    for i in range(m.num_episodes):
        _assert_batches_equal(m.episode(i), z.episode(i))
    _assert_batches_equal(m[3:50], z[3:50])
    _assert_batches_equal(m[::7], z[::7])
    _assert_batches_equal(m[:], z[:])


def test_zarr_columns_match_memmap_and_zarr_itself(zarr_pair: tuple[Dataset, Dataset]) -> None:
    """Every way of indexing a stored column gives the memmap values, and zarr's own reader
    (``array[...]``) reads the files the builder wrote to the same values."""
    m, z = zarr_pair
    for key in m.manifest.fields:
        mc, zc = np.asarray(m.column(key)), z.column(key)
        n = len(mc)
        np.testing.assert_array_equal(np.asarray(zc), mc, err_msg=key)
        np.testing.assert_array_equal(zc._array[...], mc, err_msg=key)
        for sl in (slice(0, 1), slice(4, 23), slice(n - 3, None), slice(2, n, 3), slice(5, 5)):
            np.testing.assert_array_equal(zc[sl], mc[sl], err_msg=f"{key}[{sl}]")
        for i in (0, 4, n - 1, -1, -n):
            np.testing.assert_array_equal(zc[i], mc[i], err_msg=f"{key}[{i}]")
        idx = np.array([[n - 1, 0], [3, 3]])
        np.testing.assert_array_equal(zc[idx], mc[idx], err_msg=key)
        np.testing.assert_array_equal(zc[np.array([], np.int64)], mc[np.array([], np.int64)])
        with pytest.raises(IndexError):
            zc[np.array([n])]
        with pytest.raises(IndexError):
            zc[np.array([-n - 1])]


def test_zarr_missing_shard_or_chunk_is_damage(zarr_pair: tuple[Dataset, Dataset]) -> None:
    from rlds_cli.cache.backends.zarr.read import MissingChunkError

    z = zarr_pair[1]
    reader = z.column("pixels")._reader
    base = z.directory / "arrays" / "pixels" / "c"
    victim = base / "2" / "0" / "0" / "0"  # rows 6-8 (sharded) or row 2 (one file per chunk)
    victim.unlink()
    row = 6 if reader.per_shard else 2
    with pytest.raises(MissingChunkError, match="is missing"):
        open_dataset("zarr").column("pixels")[np.array([0, row])]
    with pytest.raises(MissingChunkError, match="is missing"):
        open_dataset("zarr").column("pixels")[row : row + 1]
    assert open_dataset("zarr").check_files() == [f"zarr chunk {victim} is missing"]
    np.testing.assert_array_equal(  # the other chunks still read
        open_dataset("zarr").column("pixels")[np.array([0, 1])], np.asarray(zarr_pair[0].column("pixels"))[:2]
    )


def test_zarr_chunk_left_out_of_its_shard_is_damage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard whose index marks a chunk as not stored (zarr's way of leaving out a chunk of
    fill values) is damage too: rlds writes every chunk."""
    import google_crc32c

    from rlds_cli.cache import DatasetBuilder
    from rlds_cli.cache.backends.zarr import write as backends
    from rlds_cli.cache.backends.zarr.read import MissingChunkError

    for name, value in ZARR_LAYOUTS["sharded"].items():
        monkeypatch.setattr(backends, name, value)
    with DatasetBuilder("z", backend="zarr") as builder:
        for block in _pixel_blocks((20,)):
            builder.append(block)
        builder.commit()
    shard = open_dataset("z").directory / "arrays" / "pixels" / "c" / "1" / "0" / "0" / "0"
    data = bytearray(shard.read_bytes())
    index = np.frombuffer(bytes(data[-(3 * 16 + 4) : -4]), "<u8").reshape(3, 2).copy()
    index[1] = 2**64 - 1  # row 4 (chunk 1 of shard 1): not stored
    table = index.tobytes()
    data[-(3 * 16 + 4) :] = table + google_crc32c.value(table).to_bytes(4, "little")
    shard.write_bytes(bytes(data))
    column = open_dataset("z").column("pixels")
    np.testing.assert_array_equal(column[np.array([3, 5])].shape, (2, 3, 4, 4))  # its neighbours read
    with pytest.raises(MissingChunkError, match=r"1 of shard .* is missing"):
        column[np.array([4])]


# ----------------------------------------------------------------------------- corruption


def test_truncated_npy_raises_corrupt(tmp_path: Path) -> None:
    source = golden_three_episodes(tmp_path / "golden.hdf5", with_next=True)
    convert(source, "cut", backend="memmap")
    path = CacheRoot().dataset_dir("cut") / "arrays" / "observation.npy"
    data = path.read_bytes()
    path.write_bytes(data[:-8])  # one row short
    ds = open_dataset("cut")  # opening reads only the manifest and the episode index
    with pytest.raises(CorruptDatasetError, match="observation"):
        ds.gather([0], keys=["observation"])
    with pytest.raises(CorruptDatasetError):
        ds.episode(0)
    # a file cut inside its header
    path.write_bytes(data[:40])
    with pytest.raises(CorruptDatasetError):
        open_dataset("cut").column("observation")
    # the other columns still read
    np.testing.assert_array_equal(open_dataset("cut").gather([1], keys=["action"])["action"], [[0.5]])


@pytest.mark.parametrize("header", ["numpy", "long"])
def test_a_header_byte_that_parses_to_the_same_array_is_still_damage(tmp_path: Path, header: str) -> None:
    """The format's minor version byte (\\x00 -> \\xff) or the dtype's byte order ('<f4' ->
    '=f4', one bit) changed a file, which read the same and passed check and verify."""
    from rlds_cli.cache.backends.memmap import load_npy

    path = tmp_path / "a.npy"
    values = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.save(path, values)
    if header == "long":  # a header numpy's own parser reads (not rlds' plain form)
        with path.open("wb") as fh:
            np.lib.format.write_array(fh, values, version=(2, 0))
    data = path.read_bytes()
    np.testing.assert_array_equal(load_npy(path, mmap=False), values)
    at = data.index(b"'<f4'") + 1
    for offset, mask in ((7, 0xFF), (at, 0x01)):
        damaged = bytearray(data)
        damaged[offset] ^= mask
        path.write_bytes(bytes(damaged))
        with pytest.raises(CorruptDatasetError, match="header is damaged"):
            load_npy(path, mmap=True)


def test_array_not_matching_manifest_raises_corrupt(tmp_path: Path, backend: str) -> None:
    source = golden_three_episodes(tmp_path / "golden.hdf5", with_next=True)
    convert(source, "wrong", backend=backend)
    ds = open_dataset("wrong")
    if backend == "memmap":
        np.save(ds.directory / "arrays" / "action.npy", np.zeros((7, 1), np.float32))  # 7 rows, not 8
        np.save(ds.directory / "arrays" / "next" / "reward.npy", np.zeros((8, 1), np.float64))
    else:
        shutil.rmtree(ds.directory / "arrays" / "action")
    fresh = open_dataset("wrong")
    with pytest.raises(CorruptDatasetError, match="action"):
        fresh.gather([0], keys=["action"])
    if backend == "memmap":
        with pytest.raises(CorruptDatasetError, match="reward"):
            fresh.gather([0], keys=["next/reward"])


def test_episode_index_not_matching_manifest_raises_corrupt(tmp_path: Path, backend: str) -> None:
    source = golden_three_episodes(tmp_path / "golden.hdf5", with_next=False)
    convert(source, "idx", backend=backend)
    path = CacheRoot().dataset_dir("idx") / "episodes.npy"
    index = np.load(path)
    np.save(path, index[:2])  # one episode short
    with pytest.raises(CorruptDatasetError, match="episode index"):
        open_dataset("idx")
    changed = index.copy()
    changed["length"][0] = 4  # lengths no longer add up to num_steps
    np.save(path, changed)
    with pytest.raises(CorruptDatasetError):
        open_dataset("idx")
    path.write_bytes(b"not an npy file")
    with pytest.raises(CorruptDatasetError):
        open_dataset("idx")
    path.unlink()
    with pytest.raises(CorruptDatasetError):
        open_dataset("idx")


def test_newer_format_version_raises_corrupt(tmp_path: Path) -> None:
    source = golden_three_episodes(tmp_path / "golden.hdf5", with_next=True)
    convert(source, "future")
    convert(source, "present")
    path = CacheRoot().dataset_dir("future") / "manifest.json"
    data = json.loads(path.read_text())
    data["format_version"] = FORMAT_VERSION + 1
    path.write_text(json.dumps(data))
    rewrite_manifest(path)
    with pytest.raises(CorruptDatasetError, match="format_version") as info:
        open_dataset("future")
    assert "upgrade" in info.value.hint
    with pytest.raises(CorruptDatasetError):
        CacheRoot().manifest("future")
    # listing skips it and still shows the readable one
    assert [m.name for m in CacheRoot().iter_manifests()] == ["present"]
    assert CacheRoot().exists("future")  # a manifest is there, it just cannot be read


@pytest.mark.parametrize(
    "damage",
    ["not_json", "wrong_format", "missing_fields", "string_version", "bad_field_spec"],
)
def test_malformed_manifest_raises_corrupt(tmp_path: Path, damage: str) -> None:
    source = golden_three_episodes(tmp_path / "golden.hdf5", with_next=True)
    convert(source, "bad")
    path = CacheRoot().dataset_dir("bad") / "manifest.json"
    data = json.loads(path.read_text())
    if damage == "not_json":
        path.write_text("{ half a manifest")
    else:
        if damage == "wrong_format":
            data["format"] = "something-else"
        elif damage == "missing_fields":
            del data["fields"]
        elif damage == "string_version":
            data["format_version"] = "1"
        elif damage == "bad_field_spec":
            data["fields"]["action"] = {"shape": [1]}
        path.write_text(json.dumps(data))
    with pytest.raises(CorruptDatasetError):
        open_dataset("bad")
    assert list(CacheRoot().iter_manifests()) == []


# ----------------------------------------------------------------------------- names


def test_unknown_name_raises_not_found(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="nothing-here"):
        open_dataset("nothing-here")
    with pytest.raises(FileNotFoundError):  # also the builtin
        open_dataset("nothing-here")
    with pytest.raises(DatasetNotFoundError):
        CacheRoot().manifest("nothing/here")
    assert not CacheRoot().exists("nothing-here")
    assert list(CacheRoot().iter_manifests()) == []
    # a directory without a manifest is not a dataset
    (CacheRoot().datasets_dir / "half").mkdir(parents=True)
    with pytest.raises(DatasetNotFoundError):
        open_dataset("half")
    assert not CacheRoot().exists("half")
    with pytest.raises(DatasetNotFoundError):
        Dataset(CacheRoot().datasets_dir / "half")


@pytest.mark.parametrize(
    "name",
    [
        "",
        "a--b",
        "x/a--b",
        "../x",
        "..",
        ".",
        "./x",
        "/abs",
        "a/",
        "a//b",
        ".hidden",
        "-dash",
        "a b",
        "a\\b",
        "a/../b",
        "x" * 201,
        "ümlaut",
        "a\nb",
    ],
)
def test_invalid_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(InvalidNameError):
        validate_name(name)
    with pytest.raises(ValueError):  # also the builtin
        validate_name(name)
    with pytest.raises(InvalidNameError):
        open_dataset(name)
    with pytest.raises(InvalidNameError):
        CacheRoot().dataset_dir(name)
    source = golden_three_episodes(tmp_path / "golden.hdf5", with_next=True)
    with pytest.raises(InvalidNameError):
        convert(source, name)
    assert not CacheRoot().datasets_dir.exists() or list(CacheRoot().datasets_dir.iterdir()) == []


def test_non_string_name_is_refused() -> None:
    with pytest.raises(InvalidNameError):
        validate_name(None)  # type: ignore[arg-type]
    with pytest.raises(InvalidNameError):
        validate_name(b"bytes")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["a", "hopper-medium-v2", "D4RL/door/human-v2", "a.b_c-d/E9", "x" * 200])
def test_valid_names_are_accepted(name: str) -> None:
    assert validate_name(name) == name


def test_names_with_slashes_map_to_double_dash_directories(tmp_path: Path, backend: str) -> None:
    source = golden_three_episodes(tmp_path / "golden.hdf5", with_next=True)
    result = convert(source, "D4RL/door/human-v2", backend=backend)
    root = CacheRoot()
    assert result.path == root.datasets_dir / "D4RL--door--human-v2"
    assert root.dataset_dir("D4RL/door/human-v2") == root.datasets_dir / "D4RL--door--human-v2"
    assert sorted(p.name for p in root.datasets_dir.iterdir()) == ["D4RL--door--human-v2"]
    assert (root.datasets_dir / "D4RL--door--human-v2" / "manifest.json").is_file()
    assert root.exists("D4RL/door/human-v2")
    assert [m.name for m in root.iter_manifests()] == ["D4RL/door/human-v2"]
    ds = open_dataset("D4RL/door/human-v2")
    assert ds.name == "D4RL/door/human-v2"
    np.testing.assert_array_equal(ds[:]["observation"], golden_column(True, "observation"))
    # the lock file uses the same entry name
    assert (root.locks_dir / "D4RL--door--human-v2.lock").exists()
    # a different name with the same parts in another order is another dataset
    assert not root.exists("D4RL/human-v2/door")


def test_open_dataset_with_explicit_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = golden_three_episodes(tmp_path / "golden.hdf5", with_next=True)
    other = tmp_path / "other-root"
    convert(source, "elsewhere", root=other)
    assert (other / "datasets" / "elsewhere" / "manifest.json").is_file()
    with pytest.raises(DatasetNotFoundError):
        open_dataset("elsewhere")  # not in $RLDS_HOME
    for root in (other, str(other), CacheRoot(other)):
        ds = open_dataset("elsewhere", root=root)
        np.testing.assert_array_equal(ds[:]["next/reward"], golden_column(True, "next/reward"))
    monkeypatch.setenv("RLDS_HOME", str(other))
    assert open_dataset("elsewhere").num_steps == 8


def _blosc_chunk_flags(shard: Path, chunks: int) -> list[int]:
    """The Blosc flags byte of each stored chunk of a shard file (index at its end)."""
    data = shard.read_bytes()
    index = np.frombuffer(data[-(16 * chunks + 4) : -4], "<u8").reshape(chunks, 2)
    return [data[int(offset) + 2] for offset, _ in index if offset != 2**64 - 1]


def test_zarr_shards_that_do_not_compress_are_stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each shard is compressed only when a sample of its chunks shrinks: noise frames are stored
    as Blosc's uncompressed frames (a copy, not LZ4's work for nothing), flat frames compressed;
    both read back exactly, by rlds's reader and by zarr's own."""
    from rlds_cli.cache import DatasetBuilder
    from rlds_cli.cache.backends.zarr import write as backends
    from rlds_cli.formats.base import StepBlock

    # one (3, 8, 8) frame a chunk (Blosc stores anything under 128 bytes as it is), 8 a shard
    monkeypatch.setattr(backends, "ZARR_CHUNK_BYTES", 192)
    monkeypatch.setattr(backends, "ZARR_SHARD_BYTES", 192 * 8)
    rng = np.random.default_rng(5)
    n = 40  # 41 frames: shards 0, 2, 4 noise, 1, 3 flat, 5 the last frame (noise)
    frames = rng.integers(0, 256, (n + 1, 3, 8, 8), dtype=np.uint8)
    flat = (np.arange(n + 1) // 8) % 2 == 1
    frames[flat] = 7
    flags = np.zeros((n, 1), bool)
    flags[-1] = True
    block = StepBlock(
        steps={"action": np.zeros((n, 1), np.int64), "next/reward": np.zeros((n, 1), np.float32),
               "next/terminated": flags, "next/truncated": np.zeros((n, 1), bool)},
        observations={"pixels": frames},
        ends=np.array([n - 1]),
    )  # fmt: skip
    with DatasetBuilder("z", backend="zarr") as builder:
        builder.append(block)
        builder.commit()
    ds = open_dataset("z")
    column = ds.column("pixels")
    np.testing.assert_array_equal(np.asarray(column), frames)
    np.testing.assert_array_equal(column._array[...], frames)
    np.testing.assert_array_equal(column[np.array([40, 0, 9, 8, 17])], frames[[40, 0, 9, 8, 17]])
    memcpyed = 0x02  # Blosc's flag for a chunk stored as it is
    shards = ds.directory / "arrays" / "pixels" / "c"
    for s in range(6):
        stored = {bool(f & memcpyed) for f in _blosc_chunk_flags(shards / str(s) / "0" / "0" / "0", 8)}
        assert stored == {s % 2 == 0}, f"shard {s}"
