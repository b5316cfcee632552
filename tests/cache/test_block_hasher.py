"""Content digests computed on a helper thread while a block is written
(rlds_cli/cache/digest.py BlockHasher): the digests are those of the inline path and of the
stored columns read back; a hashing error reaches the caller."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import xxhash

from rlds_cli.cache import digest
from rlds_cli.cache.builder import DatasetBuilder
from rlds_cli.cache.opening import open_dataset
from rlds_cli.formats.base import StepBlock
from tests.waits import HANG_SECONDS


def test_threaded_digests_equal_inline_ones() -> None:
    rng = np.random.default_rng(0)
    blocks = [rng.standard_normal((60_000, 7)).astype(np.float32) for _ in range(3)]  # 1.7 MB each
    inline, threaded = digest.ColumnHasher(np.float32), digest.ColumnHasher(np.float32)
    hasher = digest.BlockHasher()
    try:
        for rows in blocks:
            inline.update(rows)
            wait = hasher.start([(threaded, rows)])
            assert hasher._pool is not None  # large enough for the helper thread
            wait()
    finally:
        hasher.close()
    assert hasher._pool is None
    assert threaded.hexdigest() == inline.hexdigest()
    assert inline.hexdigest() == xxhash.xxh3_128(b"".join(b.tobytes() for b in blocks)).hexdigest()


def test_small_work_waits_for_the_threads_earlier_work() -> None:
    """Work too small for the thread is still hashed after what the thread holds: each column's
    hasher is fed in call order (a writer hashes a large episode, then a one-step one)."""
    order: list[str] = []
    gate = threading.Event()

    class Held:  # holds the thread until the gate opens
        def update(self, rows: np.ndarray) -> None:
            gate.wait(HANG_SECONDS)
            order.append("large")

    class Small:
        def update(self, rows: np.ndarray) -> None:
            order.append("small")

    hasher = digest.BlockHasher()
    try:
        first = hasher.start([(Held(), np.zeros(digest.PARALLEL_MIN_BYTES, np.uint8))])  # type: ignore[list-item]
        second = hasher.start([(Small(), np.zeros(8, np.uint8))])  # type: ignore[list-item]
        assert order == []  # not hashed inline ahead of the held work
        gate.set()
        first()
        second()
    finally:
        hasher.close()
    assert order == ["large", "small"]
    assert hasher.start([(Small(), np.zeros(8, np.uint8))]) is not None and order[-1] == "small"  # type: ignore[list-item]


def test_a_hashing_error_reaches_the_caller() -> None:
    class Broken:
        nbytes = 1 << 30

        def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
            raise RuntimeError("unreadable rows")

    hasher = digest.BlockHasher()
    try:
        wait = hasher.start([(digest.ColumnHasher(np.float32), Broken())])
        with pytest.raises(RuntimeError, match="unreadable rows"):
            wait()
    finally:
        hasher.close()


def test_large_blocks_record_the_digests_of_the_stored_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLDS_FSYNC", "0")
    rng = np.random.default_rng(1)
    with DatasetBuilder("big", root=tmp_path) as builder:
        for n in (40_000, 25_000):
            truncated = np.zeros((n, 1), bool)
            truncated[-1] = True
            builder.append(
                StepBlock(
                    steps={
                        "action": rng.standard_normal((n, 6)).astype(np.float32),
                        "next/reward": rng.standard_normal((n, 1)).astype(np.float32),
                        "next/terminated": np.zeros((n, 1), bool),
                        "next/truncated": truncated,
                    },
                    observations={"observation": rng.standard_normal((n + 1, 17)).astype(np.float32)},
                    ends=np.array([n - 1]),
                )
            )
        manifest = builder.commit(source={"generator": "tests/cache/test_block_hasher.py"})
    ds = open_dataset("big", tmp_path)
    recorded = manifest.content_digest["columns"]
    assert sorted(recorded) == sorted(ds.manifest.fields)
    for key, spec in ds.manifest.fields.items():
        assert digest.column_digest(ds.column(key), spec.dtype) == recorded[key], key
