"""The zarr layout chosen from the row size (one-row chunks for frames), the batched chunk reads
(addresses found once per read, decoded on threads), the old layout still read, and small
columns read whole into RAM at open: every read equals the rows written."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlds_cli.cache.backends import get_backend, zarr_chunk_rows
from rlds_cli.cache.backends.zarr import codec as zarr_codec
from rlds_cli.cache.backends.zarr import write as zarr_write
from rlds_cli.cache.backends.zarr.read import ZarrColumn
from rlds_cli.errors import CorruptDatasetError


def _write(directory: Path, key: str, rows: np.ndarray) -> None:
    writer = get_backend("zarr").create_column(directory, key, rows.dtype, tuple(rows.shape[1:]))
    for start in range(0, len(rows), 37):  # appended in pieces, as a conversion appends
        writer.append(rows[start : start + 37])
    assert writer.close(fsync=False) == len(rows)


def _on_disk(directory: Path, key: str, monkeypatch: pytest.MonkeyPatch) -> ZarrColumn:
    monkeypatch.setattr(zarr_write, "ZARR_IN_RAM_BYTES", 0)
    column = get_backend("zarr").open_column(directory, key)
    assert isinstance(column, ZarrColumn) and column._reader is not None
    return column


def _reads(column: Any, rows: np.ndarray) -> None:
    """Every kind of first-axis read of ``column`` against the ``rows`` written."""
    n = len(rows)
    rng = np.random.default_rng(0)
    picks = rng.integers(0, n, 300)
    for index in (
        picks,  # unsorted, with repeats
        np.sort(np.unique(picks)),  # sorted and distinct: decoded straight into the output
        np.array([n - 1, 0, n - 1, -1, -n]),  # ends, repeats, negatives
        picks.reshape(20, 15),  # any index shape
    ):
        np.testing.assert_array_equal(column[index], rows[index])
    for lo, hi in ((0, n), (1, n - 1), (3, 4), (n - 5, n), (7, 7), (2, 40)):
        np.testing.assert_array_equal(column[lo:hi], rows[lo:hi])
    np.testing.assert_array_equal(column[1:n:3], rows[1:n:3])
    np.testing.assert_array_equal(column[5], rows[5])
    np.testing.assert_array_equal(column[-1], rows[-1])
    # the same rows twice in a row: a multi-row layout reuses the chunks decoded last time
    np.testing.assert_array_equal(column[picks + 0], rows[picks])
    np.testing.assert_array_equal(column[np.minimum(picks + 1, n - 1)], rows[np.minimum(picks + 1, n - 1)])


def test_chunks_hold_whole_rows_and_a_frame_is_a_chunk_of_its_own() -> None:
    assert zarr_chunk_rows(np.dtype(np.uint8), (84, 84)) == 1  # a 7 KB gray Atari frame
    assert zarr_chunk_rows(np.dtype(np.uint8), (3, 84, 84)) == 1
    assert zarr_chunk_rows(np.dtype(np.float32), (32, 32)) == 1  # 4 KiB exactly
    assert zarr_chunk_rows(np.dtype(np.uint8), (4095,)) == 4  # under the bound: whole rows in 16 KiB
    assert zarr_chunk_rows(np.dtype(np.float32), (17,)) == 16 * 1024 // 68


@pytest.mark.parametrize(
    ("dtype", "row_shape", "chunk_rows"),
    [
        (np.uint8, (64, 64), 1),  # frames: one-row chunks
        (np.float32, (32, 32), 1),  # 4-byte items in one-row chunks
        (np.int16, (3, 600), 4),  # a few rows a chunk
        (np.float64, (3,), 682),  # many rows a chunk, a partial last chunk
        (np.bool_, (1,), 1024),
    ],
)
def test_every_read_equals_the_rows_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: Any, row_shape: tuple[int, ...], chunk_rows: int
) -> None:
    n = 9 * chunk_rows + 7 if chunk_rows > 10 else 230  # a partial last chunk
    rng = np.random.default_rng(1)
    rows = (rng.random((n, *row_shape)) * 200).astype(dtype)
    shard_bytes = 3 * max(chunk_rows, 20) * rows[0].nbytes  # several shards
    monkeypatch.setattr(zarr_write, "ZARR_SHARD_BYTES", shard_bytes)
    _write(tmp_path, "x", rows)
    column = _on_disk(tmp_path, "x", monkeypatch)
    reader = column._reader
    assert reader is not None and reader.chunk_rows == chunk_rows
    assert reader._addr is not None, "sharded chunks are found by address, whatever their rows"
    assert len([p for p in (tmp_path / "arrays" / "x" / "c").rglob("*") if p.is_file()]) > 1
    _reads(column, rows)


def test_reads_split_across_threads_equal_one_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = np.random.default_rng(2).integers(0, 255, (300, 64, 64), dtype=np.uint8)
    _write(tmp_path, "x", rows)
    column = _on_disk(tmp_path, "x", monkeypatch)
    for threads in (1, 3):
        monkeypatch.setattr(zarr_codec, "_threads", threads)
        monkeypatch.setattr(zarr_codec, "_pool", None)
        _reads(column, rows)


def test_run_split_covers_every_position_once_and_reraises() -> None:
    seen: list[int] = []
    zarr_codec.run_split(1000, lambda a, b: seen.extend(range(a, b)))
    assert sorted(seen) == list(range(1000))

    def failing(a: int, b: int) -> None:
        if a == 0:
            raise ValueError("chunk 0 does not decode")

    with pytest.raises(ValueError, match="chunk 0"):
        zarr_codec.run_split(1000, failing)


def test_the_cpu_count_is_asked_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = np.random.default_rng(3).integers(0, 255, (100, 64, 64), dtype=np.uint8)
    _write(tmp_path, "x", rows)
    column = _on_disk(tmp_path, "x", monkeypatch)
    zarr_codec.read_threads()

    def asked(*args: Any) -> Any:
        raise AssertionError("the CPU count was asked again by a read")

    monkeypatch.setattr(os, "cpu_count", asked)
    monkeypatch.setattr(os, "sched_getaffinity", asked, raising=False)
    np.testing.assert_array_equal(column[np.arange(99, -1, -1)], rows[::-1])


def test_a_missing_shard_of_one_row_chunks_is_damage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = np.random.default_rng(4).integers(0, 255, (200, 64, 64), dtype=np.uint8)
    monkeypatch.setattr(zarr_write, "ZARR_SHARD_BYTES", 64 * 4096)  # 64 frames a shard
    _write(tmp_path, "x", rows)
    (tmp_path / "arrays" / "x" / "c" / "1" / "0" / "0").unlink()  # rows 64..127
    column = _on_disk(tmp_path, "x", monkeypatch)
    np.testing.assert_array_equal(column[np.arange(0, 64)], rows[:64])  # other shards still read
    for read in (lambda: column[np.array([3, 70])], lambda: column[60:130], lambda: column[100]):
        with pytest.raises(CorruptDatasetError, match=r"c/1/0/0 is missing"):
            read()


def test_a_small_column_is_read_into_ram_at_open_and_equals_its_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = np.random.default_rng(5).standard_normal((5000, 3)).astype(np.float32)
    _write(tmp_path, "reward", rows)
    in_ram = get_backend("zarr").open_column(tmp_path, "reward")
    assert type(in_ram) is np.ndarray and not in_ram.flags.writeable
    on_disk = _on_disk(tmp_path, "reward", monkeypatch)
    np.testing.assert_array_equal(in_ram, on_disk[:])
    np.testing.assert_array_equal(in_ram, rows)
    picks = np.random.default_rng(6).integers(0, len(rows), 256)
    np.testing.assert_array_equal(in_ram.take(picks, 0), on_disk[picks])
    # over the budget: read by chunks
    monkeypatch.setattr(zarr_write, "ZARR_IN_RAM_BYTES", rows.nbytes - 1)
    assert isinstance(get_backend("zarr").open_column(tmp_path, "reward"), ZarrColumn)
    monkeypatch.setattr(zarr_write, "ZARR_IN_RAM_BYTES", rows.nbytes)
    assert isinstance(get_backend("zarr").open_column(tmp_path, "reward"), np.ndarray)


def test_a_damaged_small_column_is_refused_when_opened(tmp_path: Path) -> None:
    rows = np.arange(3000, dtype=np.int64).reshape(3000, 1)
    _write(tmp_path, "action", rows)
    shard = next(p for p in (tmp_path / "arrays" / "action" / "c").rglob("*") if p.is_file())
    shard.write_bytes(shard.read_bytes()[:-100])  # truncated: its index is gone
    with pytest.raises(CorruptDatasetError, match="action"):
        get_backend("zarr").open_column(tmp_path, "action")


def test_the_old_layout_of_several_frames_a_chunk_is_still_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Datasets written before frames were a chunk each hold two 7 KB frames in a 16 KiB chunk
    (and, before sharding, one file a chunk): both are read as they are."""
    from rlds_cli.cache import DatasetBuilder, open_dataset
    from rlds_cli.formats.base import StepBlock
    from rlds_cli.loader import FrameStack, Loader

    rng = np.random.default_rng(7)
    blocks = []
    for n in (40, 3, 71):
        flags = np.zeros((n, 1), bool)
        flags[-1] = True
        base = rng.integers(0, 255, (84, 84), dtype=np.uint8)
        frames = np.repeat(base[None], n + 1, 0)
        frames[:, rng.integers(0, 80) :][:, :4] = np.arange(n + 1, dtype=np.uint8)[:, None, None]
        blocks.append(
            StepBlock(
                steps={
                    "action": rng.integers(0, 6, (n, 1)),
                    "next/reward": rng.standard_normal((n, 1)).astype(np.float32),
                    "next/terminated": flags,
                    "next/truncated": np.zeros((n, 1), bool),
                },
                observations={"observation": frames},
                ends=np.array([n - 1]),
            )
        )

    def build(name: str, backend: str) -> Any:
        with DatasetBuilder(name, backend=backend) as builder:
            for block in blocks:
                builder.append(block)
            builder.commit()
        return open_dataset(name)

    memmap = build("mm", "memmap")
    now = build("now", "zarr")
    monkeypatch.setattr(zarr_write, "ZARR_ROW_CHUNK_BYTES", 2**62)  # the rule before: 16 KiB chunks
    old = build("old", "zarr")
    monkeypatch.setattr(zarr_write, "ZARR_SHARD_BYTES", 0)
    unsharded = build("unsharded", "zarr")
    monkeypatch.undo()  # read with today's settings, every column by its chunks
    monkeypatch.setattr(zarr_write, "ZARR_IN_RAM_BYTES", 0)
    chunk_rows = {}
    for ds in (now, old, unsharded):
        obs = ds.column("observation")
        chunk_rows[ds.name] = obs.column._reader.chunk_rows
        idx = np.random.default_rng(8).integers(0, memmap.num_steps, 100)
        for key, value in memmap.gather(idx).items():
            np.testing.assert_array_equal(np.asarray(ds.gather(idx)[key]), np.asarray(value), err_msg=key)
        for key, value in memmap[10:60].items():
            np.testing.assert_array_equal(np.asarray(ds[10:60][key]), np.asarray(value), err_msg=key)
        plain_mm, plain = Loader(memmap, 64, seed=2, in_memory=False), Loader(ds, 64, seed=2, in_memory=False)
        for _ in range(3):  # batches into reused buffers: each equals memmap's
            want, got = plain_mm.sample(), plain.sample()
            for key in want:
                np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(want[key]), err_msg=key)
        a = Loader(memmap, 32, seed=1, in_memory=False, transform=FrameStack(4)).sample()
        b = Loader(ds, 32, seed=1, in_memory=False, transform=FrameStack(4)).sample()
        for key in a:
            np.testing.assert_array_equal(np.asarray(b[key]), np.asarray(a[key]), err_msg=key)
    assert chunk_rows == {"now": 1, "old": 2, "unsharded": 2}
    shutil.rmtree(memmap.directory)


def _spied_compiled(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The compiled loop (numba is a dependency), counting the chunks it is given."""
    zarr_codec._compiled = False  # looked up again (another test may have set RLDS_NUMBA=0)
    compiled = zarr_codec.compiled_decode()
    assert compiled is not None, "numba is a dependency: the compiled loop must be found"
    given: list[int] = []

    def spy(sources: np.ndarray, dests: np.ndarray, nbytes: int, a: int, b: int) -> int:
        given.append(b - a)
        return compiled(sources, dests, nbytes, a, b)

    monkeypatch.setattr(zarr_codec, "_compiled", spy)
    return given


@pytest.mark.parametrize("threads", [1, 2])
def test_the_compiled_loop_reads_what_the_python_loop_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    rows = np.random.default_rng(5).integers(0, 6, (300, 64, 64), dtype=np.uint8)  # compressible
    _write(tmp_path, "x", rows)
    column = _on_disk(tmp_path, "x", monkeypatch)
    monkeypatch.setattr(zarr_codec, "_threads", threads)
    monkeypatch.setattr(zarr_codec, "_pool", None)
    given = _spied_compiled(monkeypatch)
    _reads(column, rows)
    assert sum(given) >= 300, "reads of many chunks go through the compiled loop"
    assert all(n < 300 for n in given) or threads == 1  # split across the threads
    given.clear()
    np.testing.assert_array_equal(column[np.arange(5)], rows[:5])
    assert given == [], "a read of a few chunks stays in Python (numba is not imported for it)"
    monkeypatch.setattr(zarr_codec, "_compiled", None)  # as without numba, or with RLDS_NUMBA=0
    _reads(column, rows)


def test_rlds_numba_0_keeps_the_python_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLDS_NUMBA", "0")
    monkeypatch.setattr(zarr_codec, "_compiled", False)
    assert zarr_codec.compiled_decode() is None
    monkeypatch.setenv("RLDS_NUMBA", "1")
    monkeypatch.setattr(zarr_codec, "_compiled", False)
    assert zarr_codec.compiled_decode() is not None


@pytest.mark.parametrize("compiled", [True, False])
def test_a_chunk_that_does_not_decode_is_damage_in_either_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compiled: bool
) -> None:
    rows = np.random.default_rng(6).integers(0, 4, (200, 64, 64), dtype=np.uint8)
    _write(tmp_path, "x", rows)
    (shard,) = [p for p in (tmp_path / "arrays" / "x" / "c").rglob("*") if p.is_file()]
    data = bytearray(shard.read_bytes())
    for i in range(200, 2000, 7):  # inside the first chunks' compressed bytes, past their headers
        data[i] ^= 0x5A
    shard.write_bytes(bytes(data))
    column = _on_disk(tmp_path, "x", monkeypatch)
    given = _spied_compiled(monkeypatch) if compiled else []
    if not compiled:
        monkeypatch.setattr(zarr_codec, "_compiled", None)
    with pytest.raises(CorruptDatasetError, match=r"chunk 0 of .* does not decode"):
        column[np.arange(100)]
    assert bool(given) == compiled
