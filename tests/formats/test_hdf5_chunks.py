"""Gzip-compressed HDF5 rows inflated on threads (rlds_cli.formats.hdf5_util): the same rows as
h5py for every chunk shape, dtype and range; h5py reads what it cannot serve; a damaged chunk is
named, never served; a compressed D4RL file converts to the same dataset as the plain one."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from rlds_cli.cache import open_dataset
from rlds_cli.errors import SourceFormatError
from rlds_cli.formats.hdf5_util import ChunkRows, inflatable
from rlds_cli.sources.convert import convert
from tests.d4rl_fixtures import write_d4rl

pytestmark = pytest.mark.usefixtures("isolated_cache")


def _arrays(rng: np.random.Generator) -> dict[str, np.ndarray]:
    n = 97
    return {
        "obs": rng.standard_normal((n, 5)).astype(np.float32),
        "big_endian": rng.integers(-(2**40), 2**40, (n, 3)).astype(">i8"),
        "flags": rng.random(n) < 0.3,
        "frames": rng.integers(0, 256, (n, 4, 6, 3), dtype=np.uint8),
        "reward": rng.standard_normal(n),
    }


@pytest.mark.parametrize("chunks", [True, "column", "odd"])
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("shuffle", [False, True])
def test_every_range_reads_as_h5py_reads_it(
    tmp_path: Path, chunks: object, threads: int, shuffle: bool
) -> None:
    rng = np.random.default_rng(7)
    path = tmp_path / "f.hdf5"
    with h5py.File(path, "w") as f:
        for key, data in _arrays(rng).items():
            shape = {True: True, "column": (10, *([1] * (data.ndim - 1))), "odd": (7, *data.shape[1:-1], 2)}
            chunk = shape[chunks] if data.ndim > 1 or chunks is True else (7,)  # type: ignore[index]
            f.create_dataset(key, data=data, compression="gzip", chunks=chunk, shuffle=shuffle)
    rows = ChunkRows(threads)
    with h5py.File(path, "r") as f:
        for key in f:
            assert inflatable(f[key]), key
            for start, stop in [(0, 97), (0, 1), (96, 97), (3, 3), *rng.integers(0, 98, (25, 2)).tolist()]:
                start, stop = min(start, stop), max(start, stop)
                np.testing.assert_array_equal(rows.read(f[key], start, stop), f[key][start:stop], err_msg=key)
            out = np.full((40, *f[key].shape[1:]), 1, f[key].dtype)
            assert rows.read(f[key], 50, 90, out) is out
            np.testing.assert_array_equal(out, f[key][50:90])
    rows.close()


def test_only_deflate_with_or_without_shuffle_is_inflated(tmp_path: Path) -> None:
    data = np.arange(60, dtype=np.float32).reshape(20, 3)
    with h5py.File(tmp_path / "f.hdf5", "w") as f:
        made = {
            "gzip": f.create_dataset("gzip", data=data, compression="gzip"),
            "shuffled": f.create_dataset("shuffled", data=data, compression="gzip", shuffle=True),
            "checksummed": f.create_dataset("checksummed", data=data, compression="gzip", fletcher32=True),
            "lzf": f.create_dataset("lzf", data=data, compression="lzf"),
            "plain": f.create_dataset("plain", data=data),
            "chunked": f.create_dataset("chunked", data=data, chunks=(5, 3)),
            "text": f.create_dataset("text", data=np.array([b"a", b"b"]), compression="gzip"),
            "compound": f.create_dataset(
                "compound", data=np.zeros(4, [("a", "<f4"), ("b", "<i2")]), compression="gzip"
            ),
        }
        assert [k for k, d in made.items() if inflatable(d)] == ["gzip", "shuffled"]
    assert not inflatable(np.zeros(3))  # an .npz member


@pytest.mark.parametrize("stored", ["24-bit int32", "bfloat16"])
def test_a_type_numpy_does_not_store_as_is_is_left_to_h5py(tmp_path: Path, stored: str) -> None:
    """HDF5 converts a reduced-precision integer or a bfloat16 on read; their bytes viewed as the
    numpy type h5py reports are other numbers (-1 was stored as 16777215, exit 0)."""
    path = tmp_path / "f.hdf5"
    values = np.array([-1, -2, 5, -100000, 7, 0, 3, -8, 9, -11], np.int32)
    write_d4rl(
        path,
        observations=np.zeros((10, 2), np.float32),
        actions=np.zeros((10, 1), np.float32),
        rewards=np.zeros(10, np.float32),
        terminals=np.arange(10) == 9,
        timeouts=np.zeros(10, bool),
    )
    with h5py.File(path, "a") as f:
        if stored == "bfloat16":
            kind = h5py.h5t.IEEE_F32LE.copy()  # bfloat16: float32's sign and exponent, 7 mantissa bits
            kind.set_fields(15, 7, 8, 0, 7)
            kind.set_size(2)
            kind.set_ebias(127)
            values = values.astype(np.float32) / 4
        else:
            kind = h5py.h5t.STD_I32LE.copy()
            kind.set_precision(24)
        plist = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        plist.set_chunk((4,))
        plist.set_deflate(4)
        column = h5py.Dataset(h5py.h5d.create(f.create_group("infos").id, b"odd", kind,
                                              h5py.h5s.create_simple((10,)), dcpl=plist))  # fmt: skip
        column[...] = values
        assert not inflatable(column)
        expected = column[()]  # HDF5's conversion (bfloat16 rounds -25000 to -24960)
        np.testing.assert_allclose(expected, values, rtol=1e-2)
    convert(path, "odd")
    np.testing.assert_array_equal(np.asarray(open_dataset("odd")[:]["info/odd"]).reshape(-1), expected)


def test_an_unwritten_chunk_is_left_to_h5py(tmp_path: Path) -> None:
    """A chunk never written holds the fill value: ChunkRows refuses it, and the D4RL reader
    reads it through h5py."""
    path = tmp_path / "f.hdf5"
    with h5py.File(path, "w") as f:
        for key, width in (("observations", 2), ("actions", 1)):
            f.create_dataset(key, data=np.arange(30 * width, dtype=np.float32).reshape(30, width))
        f.create_dataset("terminals", data=np.arange(30) % 10 == 9)
        f.create_dataset("timeouts", data=np.zeros(30, bool))
        d = f.create_dataset(
            "rewards", shape=(30,), dtype=np.float32, chunks=(10,), compression="gzip", fillvalue=2.5
        )
        d[0:10] = np.arange(10)
        with pytest.raises(OSError, match="not allocated"):
            ChunkRows(1).read(d, 5, 25)
    convert(path, "sparse")
    rewards = np.asarray(open_dataset("sparse")[:]["next/reward"]).reshape(-1)
    assert rewards[:10].tolist() == list(range(10)) and set(rewards[10:].tolist()) == {2.5}


def _compressed_copy(source: Path, dest: Path, chunk_rows: int) -> None:
    """``source`` rewritten with every array gzip-compressed in chunks of ``chunk_rows`` rows and
    one column, as h5py's automatic chunking lays out D4RL's arrays."""
    with h5py.File(source, "r") as src, h5py.File(dest, "w") as out:
        for key in src:
            data = src[key][()]
            out.create_dataset(
                key, data=data, compression="gzip", chunks=(chunk_rows, *([1] * (data.ndim - 1)))
            )


@pytest.mark.parametrize("seed", range(12))
def test_a_compressed_d4rl_file_converts_as_the_plain_one(tmp_path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 80))
    obs = rng.standard_normal((n, 3)).astype(np.float32)
    ends = rng.random(n) < 0.15
    nxt = np.concatenate([obs[1:], rng.standard_normal((1, 3)).astype(np.float32)])
    nxt[ends] = -obs[ends]  # an episode's final observation is not the next row's
    write_d4rl(
        tmp_path / "plain.hdf5",
        observations=obs,
        actions=rng.standard_normal((n, 2)).astype(np.float32),
        rewards=rng.standard_normal(n).astype(np.float32),
        terminals=ends & (rng.random(n) < 0.5),
        timeouts=ends,
        next_observations=nxt if seed % 2 else None,
    )
    _compressed_copy(tmp_path / "plain.hdf5", tmp_path / "gz.hdf5", int(rng.integers(1, 9)))
    options = {"block_rows": int(rng.choice([1, 2, 3, 5, 7, 11, 1000]))}
    convert(tmp_path / "plain.hdf5", "plain", options=options)
    convert(tmp_path / "gz.hdf5", "gz", options=options)
    plain, gz = open_dataset("plain"), open_dataset("gz")
    a, b = plain[:], gz[:]
    assert sorted(a.keys()) == sorted(b.keys())
    for key in a:
        np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]), err_msg=key)
    assert plain.episodes["length"].tolist() == gz.episodes["length"].tolist()


def test_a_damaged_chunk_is_named_never_served(tmp_path: Path) -> None:
    n = 200
    rng = np.random.default_rng(1)
    write_d4rl(
        tmp_path / "plain.hdf5",
        observations=rng.standard_normal((n, 3)).astype(np.float32),
        actions=rng.standard_normal((n, 2)).astype(np.float32),
        rewards=rng.standard_normal(n).astype(np.float32),
        terminals=np.zeros(n, bool),
        timeouts=np.arange(n) % 50 == 49,
    )
    path = tmp_path / "gz.hdf5"
    _compressed_copy(tmp_path / "plain.hdf5", path, 40)
    with h5py.File(path, "r") as f:  # the file offset of one compressed chunk of the actions
        info = f["actions"].id.get_chunk_info_by_coord((80, 1))
    with open(path, "r+b") as raw:
        raw.seek(info.byte_offset + info.size // 2)
        byte = raw.read(1)
        raw.seek(info.byte_offset + info.size // 2)
        raw.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(SourceFormatError, match=r"gz\.hdf5: reading 'actions' failed"):
        convert(path, "gz")
