"""``load_npy`` reads the header numpy writes for a plain array without numpy's parser (which
evaluates the text as Python), and reads every other header with it: the same arrays either
way, and a damaged header is one ``CorruptDatasetError``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlds_cli.cache.backends.memmap import load_npy
from rlds_cli.cache.ted import EPISODE_DTYPE
from rlds_cli.errors import CorruptDatasetError

ARRAYS = [
    np.arange(17_000, dtype=np.float32).reshape(1000, 17),
    np.arange(5, dtype=np.int64),
    np.array([[True], [False], [True]]),
    np.array(2.5),
    np.zeros((2, 8, 8, 3), np.uint8),
    np.arange(4, dtype=">f8"),
    np.zeros((0, 6), np.float16),
    np.zeros(3, [("start", "<i8"), ("final", "?")]),  # named fields: the episode index's kind
    np.zeros(3, [("Start", "<i8"), ("x1", ">f4")]),  # names the fast path does not read: numpy's parser
    np.zeros((2, 2), [("a", "<i8"), ("b", "<u2", (3,))]),  # a sub-array field: numpy's parser
    np.zeros(0, EPISODE_DTYPE),
]


@pytest.mark.parametrize("mmap", [False, True])
@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: f"{a.dtype}{a.shape}")
def test_every_plain_array_reads_as_np_load_gives_it(tmp_path: Path, array: np.ndarray, mmap: bool) -> None:
    path = tmp_path / "a.npy"
    np.save(path, array)
    got, want = load_npy(path, mmap=mmap), np.load(path)
    assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (b"'<f4'", b"'<f5'"),  # a type numpy has not
        (b"(1000, 17)", b"(9000, 17)"),  # more rows than the file holds
        (b"False", b"Fblse"),  # not Python any more: numpy's parser says so
        (b"'descr'", b"'dEscr'"),
    ],
)
def test_a_damaged_header_is_one_clear_error(tmp_path: Path, old: bytes, new: bytes) -> None:
    path = tmp_path / "a.npy"
    np.save(path, ARRAYS[0])
    data = path.read_bytes()
    assert old in data
    path.write_bytes(data.replace(old, new, 1))
    with pytest.raises(CorruptDatasetError, match=r"a\.npy"):
        load_npy(path, mmap=True, what="array file")


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (b"'<i8'), ('length'", b"'<i9'), ('length'"),  # a type numpy has not
        (b"'|b1'", b"'|b8'"),
        (b"(4,)", b"(40,)"),  # more rows than the file holds
        (b"[('start'", b"[('st'rt'"),  # not Python any more
    ],
)
def test_a_damaged_episode_index_header_is_one_clear_error(tmp_path: Path, old: bytes, new: bytes) -> None:
    path = tmp_path / "episodes.npy"
    np.save(path, np.zeros(4, EPISODE_DTYPE))
    data = path.read_bytes()
    assert old in data
    path.write_bytes(data.replace(old, new, 1))
    with pytest.raises(CorruptDatasetError, match=r"episodes\.npy"):
        load_npy(path, mmap=False, what="episode index")
